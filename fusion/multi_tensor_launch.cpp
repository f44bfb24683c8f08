// Packing of (tensor, chunk) blocks into kernel-argument tables (see multi_tensor_launch.h).
#include "fusion/multi_tensor_launch.h"

#include <cstring>

#include "core/check.h"

namespace ft {

template <int Depth>
std::vector<MultiTensorLaunch<Depth>> pack_multi_tensor_launches(
    const std::vector<MultiTensorInput<Depth>>& tensors, int32_t chunk_size) {
  using Launch = MultiTensorLaunch<Depth>;
  FT_CHECK(chunk_size > 0, "pack_multi_tensor_launches: chunk size ", chunk_size,
           " is not positive");
  std::vector<Launch> launches;
  Launch current;
  std::memset(&current, 0, sizeof(current));
  current.chunk_size = chunk_size;
  int64_t blocks_before = 0;
  auto close_launch = [&] {
    launches.push_back(current);
    blocks_before += current.num_blocks;
    std::memset(&current, 0, sizeof(current));
    current.chunk_size = chunk_size;
    current.first_block = blocks_before;
  };
  for (const MultiTensorInput<Depth>& tensor : tensors) {
    FT_CHECK(tensor.numel >= 0, "pack_multi_tensor_launches: negative numel ", tensor.numel);
    const int64_t chunks = (tensor.numel + chunk_size - 1) / chunk_size;
    FT_CHECK(chunks <= INT32_MAX, "pack_multi_tensor_launches: ", tensor.numel,
             " floats make more chunks than an int32 counts");
    bool entered = false;  // whether `tensor` has a slot in `current`
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      if (current.num_blocks == Launch::kMaxBlocks) {
        close_launch();
        entered = false;
      }
      if (!entered) {
        if (current.num_tensors == Launch::kMaxTensors) close_launch();
        const int slot = current.num_tensors++;
        for (int d = 0; d < Depth; ++d) current.addresses[d][slot] = tensor.addresses[d];
        current.numel[slot] = tensor.numel;
        current.weight_decay[slot] = tensor.weight_decay ? 1 : 0;
        entered = true;
      }
      current.block_tensor[current.num_blocks] = static_cast<uint8_t>(current.num_tensors - 1);
      current.block_chunk[current.num_blocks] = static_cast<int32_t>(chunk);
      ++current.num_blocks;
    }
  }
  if (current.num_blocks > 0) launches.push_back(current);
  return launches;
}

template std::vector<MultiTensorLaunch<1>> pack_multi_tensor_launches(
    const std::vector<MultiTensorInput<1>>&, int32_t);
template std::vector<MultiTensorLaunch<2>> pack_multi_tensor_launches(
    const std::vector<MultiTensorInput<2>>&, int32_t);
template std::vector<MultiTensorLaunch<3>> pack_multi_tensor_launches(
    const std::vector<MultiTensorInput<3>>&, int32_t);
template std::vector<MultiTensorLaunch<4>> pack_multi_tensor_launches(
    const std::vector<MultiTensorInput<4>>&, int32_t);

}  // namespace ft
