// The IDX format of (Fashion-)MNIST: a magic number giving the element type and rank,
// big-endian dimensions, then the raw data; plain or gzip-compressed.
#pragma once

#include <string>

#include "core/tensor.h"

namespace kiln {

// Reads an IDX file (gzip or plain) into a host tensor: u8 data as u8, i32 as i32,
// f32 as f32, f64 as f64. Throws kiln::Error naming the file and what is wrong with it
// (missing, truncated, corrupt, wrong magic, absurd dimensions, trailing bytes).
Tensor read_idx(const std::string& path);

// Writes a tensor as an uncompressed IDX file (for tests and tools).
void write_idx(const std::string& path, const Tensor& t);

}  // namespace kiln
