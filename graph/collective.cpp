// The registry of collective groups, and group 0: this process alone.
#include "graph/collective.h"

#include <map>
#include <mutex>

#include "core/error.h"

namespace kiln {
namespace {

class SingleProcess final : public Collective {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_reduce_mean_host(std::span<Tensor>) override {}  // the mean of one rank is itself
  void all_reduce_mean_device(std::span<const DeviceBuffer> buffers, void*) override {
    for (const DeviceBuffer& b : buffers)
      KILN_CHECK(b.in == b.out,
                 "all_reduce_mean: group 0 (one process) averages in place only on the device");
  }
};

struct Registry {
  std::mutex mutex;
  std::map<int, std::shared_ptr<Collective>> groups{{0, std::make_shared<SingleProcess>()}};
  int next = 1;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

int register_collective(std::shared_ptr<Collective> group) {
  KILN_ASSERT(group != nullptr, "register_collective: null group");
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.groups.emplace(r.next, std::move(group));
  return r.next++;
}

void unregister_collective(int id) {
  KILN_ASSERT(id != 0, "group 0 (this process) cannot be removed");
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.groups.erase(id);
}

Collective& collective(int id) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.groups.find(id);
  KILN_CHECK(it != r.groups.end(),
             "all_reduce_mean: no collective group {} is registered in this process", id);
  return *it->second;
}

}  // namespace kiln
