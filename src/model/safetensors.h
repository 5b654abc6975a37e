// Reading and writing safetensors files and Hugging Face checkpoint folders.
#pragma once

#include <filesystem>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"

namespace deepinfer {

// How weights reach memory. Mapping starts instantly and shares pages between processes;
// reading copies into huge-page-aligned memory, which streams faster on VMs until mapped
// pages are warm (see DESIGN.md). Either way weights keep their stored dtype.
enum class LoadMode { kMmap, kRead };

// One .safetensors file, validated on open: a truncated file or malformed header is an Error
// naming the file (and the tensor, where one is at fault).
class SafetensorsFile {
 public:
  SafetensorsFile(const std::filesystem::path& path, LoadMode mode);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::filesystem::path path_;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  Buffer owned_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint folder: model.safetensors, or the shards listed by
// model.safetensors.index.json.
class TensorStore {
 public:
  TensorStore(const std::filesystem::path& folder, LoadMode mode);

  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // The tensor `name`; throws Error naming the tensor and folder when absent.
  const Tensor& get(const std::string& name) const;
  // As get(), and checks the shape, naming tensor, expected and actual shapes on mismatch.
  const Tensor& get(const std::string& name, std::initializer_list<int64_t> shape) const;
  std::vector<std::string> names() const;
  size_t total_bytes() const;
  // Gives every F8_E4M3 tensor "X" the block scales stored beside it as "X_scale_inv"
  // ([ceil(rows / block_rows), ceil(cols / block_cols)], F32 or BF16). An FP8 tensor without
  // them, or scales of the wrong shape, is an Error naming the tensor.
  void attach_block_scales(int block_rows, int block_cols);
  // Copies every tensor (and block scales) into `ops`' memory and releases the files: from
  // then on get() returns the copies. Nothing happens for a backend that works in host memory.
  void place_in(Ops& ops);

 private:
  std::filesystem::path folder_;
  std::map<std::string, Tensor> scaled_;  // FP8 tensors with their scales attached
  std::list<BlockScales> block_scales_;
  std::list<std::vector<float>> widened_scales_;  // BF16 scales as f32
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const Tensor*> index_;
  std::map<std::string, std::string> tensor_file_;
  std::map<std::string, Tensor> placed_;
  std::vector<BackendMemory> placed_memory_;
};

// A tensor to write: its name and a view of its data (any dtype, contiguous).
struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// A tensor to be written by the streaming writer: its data is produced on demand.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  size_t nbytes() const;
};

// Writes a safetensors file whose tensors are produced one at a time by `fill` into a buffer
// of spec.nbytes(), so files larger than memory can be written. Tensors keep the given order.
void write_safetensors_streaming(const std::filesystem::path& path,
                                 const std::vector<TensorSpec>& specs,
                                 const std::function<void(const TensorSpec&, void*)>& fill,
                                 const std::map<std::string, std::string>& metadata = {});

// Writes a safetensors file (tensors sorted by name, header padded to 8 bytes).
void write_safetensors(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace deepinfer
