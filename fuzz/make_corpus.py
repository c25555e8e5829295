#!/usr/bin/env python3
# Writes the seed corpora fuzz/corpus/{safetensors,idx,config,checkpoint_metadata}/: small
# valid files and near-valid ones (one thing wrong each), so the fuzzers start next to every
# validation branch, and deeply nested JSON for the JSON readers.
import gzip
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def safetensors(header, data=b"", pad=True, length=None):
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def safetensors_seeds():
    f32x6 = struct.pack("<6f", 1, 2, 3, 4, 5, 6)
    every = (struct.pack("<2d", 1.5, -2) + struct.pack("<q", -7) + struct.pack("<3f", 1, 2, 3)
             + struct.pack("<i", 9) + bytes([1, 2, 3]))
    every_header = {"__metadata__": {"step": "12", "model": "lenet"},
                    "a.f64": entry("F64", [2], 0, 16), "b.i64": entry("I64", [1], 16, 24),
                    "c.f32": entry("F32", [3], 24, 36), "d.i32": entry("I32", [], 36, 40),
                    "e.u8": entry("U8", [1, 3], 40, 43)}
    return {
        "valid_f32": safetensors({"w": entry("F32", [2, 3], 0, 24)}, f32x6),
        "valid_every_dtype": safetensors(every_header, every),
        "valid_empty": safetensors({}),
        "valid_metadata_only": safetensors({"__metadata__": {"k": "v"}}),
        "valid_zero_size": safetensors({"z": entry("F32", [0, 4], 0, 0), "u": entry("U8", [2], 0, 2)}, b"\x01\x02"),
        "valid_unpadded": safetensors({"w": entry("U8", [4], 0, 4)}, b"abcd", pad=False),
        "bad_overlap": safetensors({"a": entry("U8", [4], 0, 4), "b": entry("U8", [4], 2, 6)}, bytes(6)),
        "bad_gap": safetensors({"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 4, 6)}, bytes(6)),
        "bad_size": safetensors({"a": entry("F32", [2], 0, 4)}, bytes(4)),
        "bad_dtype": safetensors({"a": entry("I16", [2], 0, 4)}, bytes(4)),
        "valid_bf16": safetensors({"a": entry("BF16", [2], 0, 4)}, bytes([0x80, 0x3f, 0xc0, 0xff])),
        "bad_past_end": safetensors({"a": entry("F32", [4], 0, 16)}, bytes(8)),
        "bad_header_length": safetensors({"a": entry("U8", [1], 0, 1)}, b"x", length=1000),
        "bad_metadata": safetensors({"__metadata__": {"k": 1}}),
        "bad_negative_dim": safetensors({"a": entry("U8", [-1], 0, 0)}),
        "bad_huge_dims": safetensors({"a": entry("F64", [2**62, 2**62], 0, 8)}, bytes(8)),
        "bad_unknown_key": safetensors({"a": dict(entry("U8", [1], 0, 1), extra=1)}, b"x"),
        "bad_truncated": safetensors({"w": entry("F32", [2, 3], 0, 24)}, f32x6)[:-5],
    }


def idx(code, dims, data):
    return bytes([0, 0, code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + data


def idx_seeds():
    images = idx(0x08, [2, 3, 3], bytes(range(18)))
    return {
        "valid_u8_vector": idx(0x08, [5], bytes([0, 1, 2, 3, 9])),
        "valid_u8_images": images,
        "valid_i32": idx(0x0C, [2], struct.pack(">2i", -1, 7)),
        "valid_f32": idx(0x0D, [2, 2], struct.pack(">4f", 1, -2, 0.5, 3)),
        "valid_f64": idx(0x0E, [1], struct.pack(">d", 2.25)),
        "valid_gzip": gzip.compress(images, mtime=0),
        "bad_truncated": images[:-3],
        "bad_trailing": images + b"\x00",
        "bad_magic": b"\x01" + images[1:],
        "bad_type": idx(0x0B, [2], bytes(4)),
        "bad_rank": bytes([0, 0, 8, 9]) + bytes(36),
        "bad_gzip_truncated": gzip.compress(images, mtime=0)[:-6],
    }


def deep(depth, inner="1"):
    return ("[" * depth + inner + "]" * depth).encode()


CONFIG = {"model": "char-lstm", "epochs": 3, "batch-size": 32, "lr": 0.002, "seed": 7,
          "hidden": 128, "max-steps": None, "cell": "lstm"}


def config_seeds():
    return {
        "valid_seed_list": json.dumps(CONFIG).encode(),
        "bad_deep_33": b'{"lr": ' + deep(33) + b"}",
        "bad_deep_1000": deep(1000),
        "bad_deep_200000": deep(200000),
        "bad_deep_objects": b'{"a": ' * 5000 + b"1" + b"}" * 5000,
        "bad_duplicate": b'{"lr": 0.1, "lr": 0.2}',
        "bad_huge_integer": b'{"seed": 99999999999999999999999}',
        "bad_subnormal": b'{"lr": 1e-310}',
    }


def metadata(*fields):
    return b"\xff".join(f.encode() if isinstance(f, str) else f for f in fields)


def checkpoint_metadata_seeds():
    config = json.dumps(CONFIG)
    legacy = ["", "char-lstm", "40", "2", "8", "32", "7", "128", "64", "1", "64", "rnn"]
    return {
        "valid_config": metadata(config, "char-lstm", "40", "2", "8"),
        "valid_legacy": metadata(*legacy),
        "bad_contradiction": metadata(config, "lenet", "0", "1", "0"),
        "bad_step_near_2_63": metadata(config, "char-lstm", "9223372036854775800", "1", "0"),
        "bad_negative_hidden": metadata(*legacy[:7], "-1"),
        "bad_text_hidden": metadata(*legacy[:7], "abc"),
        "bad_huge_hidden": metadata(*legacy[:7], "100000000000"),
        "bad_deep_config": metadata(deep(200000), "char-lstm", "0", "1", "0"),
    }


for name, seeds in (("safetensors", safetensors_seeds()), ("idx", idx_seeds()),
                    ("config", config_seeds()),
                    ("checkpoint_metadata", checkpoint_metadata_seeds())):
    folder = os.path.join(HERE, "corpus", name)
    os.makedirs(folder, exist_ok=True)
    for seed, data in seeds.items():
        with open(os.path.join(folder, seed), "wb") as f:
            f.write(data)
