// safetensors: read (mmap, validated header) and write (atomic) of the Hugging Face tensor format.
//
// File layout: u64 little-endian header length N, N bytes of JSON ({"name": {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {...}}), then the byte buffer; offsets are relative
// to the buffer. We validate as the reference does: offsets in range, no overlap, no holes, byte
// size = numel * element size, the buffer ends at the end of the file.
//
// Reading never writes into the mapping (PROT_READ): tensors are copied out into owned CPU tensors.
// Supported dtypes: F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL. Others are refused by name.
#pragma once
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace linearize {

struct TensorInfo {
  std::string name;
  std::string dtype;            // safetensors dtype string, e.g. "BF16"
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the data buffer
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // maps and validates; throws linearize::Error
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // in file order of offsets
  bool contains(const std::string& name) const { return tensors_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // An owned CPU copy in the file's dtype.
  torch::Tensor get(const std::string& name) const;

 private:
  std::string path_;
  const uint8_t* base_ = nullptr;  // start of the mapping
  size_t size_ = 0;
  uint64_t data_start_ = 0;        // 8 + header length
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The weights of a model folder: model.safetensors, or the shards listed in
// model.safetensors.index.json ({"weight_map": {tensor: file}}), or a single .safetensors path.
class WeightStore {
 public:
  explicit WeightStore(const std::string& folder_or_file);

  bool contains(const std::string& name) const { return where_.count(name) > 0; }
  std::vector<std::string> names() const;
  const TensorInfo& info(const std::string& name) const;
  std::string file_of(const std::string& name) const;

  // The tensor converted to `dtype`; throws naming the file and tensor when it is missing or its
  // shape differs from `expected_shape` (pass {} to accept any shape).
  torch::Tensor get(const std::string& name, torch::ScalarType dtype,
                    const std::vector<int64_t>& expected_shape = {}) const;
  torch::Tensor get(const std::string& name) const;  // file dtype, any shape

  const std::string& location() const { return location_; }

 private:
  const SafetensorsFile& file_for(const std::string& name) const;
  std::string location_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> index into files_
};

// Writes tensors (any device; contiguous copies are made) atomically: a temporary file in the same
// folder, fsync, rename. Header padded to 8 bytes, tensors ordered by element size then name,
// __metadata__ gets {"format": "pt"} unless given.
// Throws Error naming the tensor and `what` when a floating-point tensor holds NaN or inf: no checkpoint or
// model with non-finite weights is ever written.
void require_finite(const std::vector<std::pair<std::string, torch::Tensor>>& tensors, const std::string& what);

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      std::map<std::string, std::string> metadata = {});

// dtype string <-> torch dtype; throws for dtypes we do not support.
torch::ScalarType safetensors_dtype(const std::string& dtype, const std::string& where);
std::string safetensors_dtype_name(torch::ScalarType dtype);

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace linearize
