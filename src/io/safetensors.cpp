#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/error.h"

namespace linearize {

namespace {

constexpr uint64_t kMaxHeaderSize = 100'000'000;

struct DtypeEntry {
  const char* name;
  torch::ScalarType type;
  int size;
};

const DtypeEntry kDtypes[] = {
    {"F32", torch::kFloat, 4},  {"F16", torch::kHalf, 2},  {"BF16", torch::kBFloat16, 2},
    {"F64", torch::kDouble, 8}, {"I64", torch::kLong, 8},  {"I32", torch::kInt, 4},
    {"I16", torch::kShort, 2},  {"I8", torch::kChar, 1},   {"U8", torch::kByte, 1},
    {"BOOL", torch::kBool, 1},
};

const char* kKnownUnsupported[] = {"U16", "U32", "U64", "C64", "F8_E5M2", "F8_E4M3", "F8_E8M0",
                                   "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F4", "F6_E2M3", "F6_E3M2"};

const DtypeEntry& dtype_entry(const std::string& dtype, const std::string& where) {
  for (const auto& e : kDtypes)
    if (dtype == e.name) return e;
  for (const char* u : kKnownUnsupported)
    if (dtype == u)
      throw Error(where + ": dtype " + dtype +
                  " is not supported (expected one of F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL)");
  throw Error(where + ": unknown dtype \"" + dtype + "\"");
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

torch::ScalarType safetensors_dtype(const std::string& dtype, const std::string& where) {
  return dtype_entry(dtype, where).type;
}

std::string safetensors_dtype_name(torch::ScalarType dtype) {
  for (const auto& e : kDtypes)
    if (e.type == dtype) return e.name;
  throw Error(std::string("cannot write tensors of dtype ") + c10::toString(dtype) + " to safetensors");
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  require_regular_file(path);
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error("cannot stat " + path + ": " + std::strerror(errno));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw Error(path + ": truncated safetensors file: " + std::to_string(size_) +
                " bytes, expected at least 8 (the header length)");
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw Error("cannot map " + path + ": " + std::strerror(errno));
  base_ = static_cast<const uint8_t*>(p);

  try {
    uint64_t header_len = 0;
    std::memcpy(&header_len, base_, 8);  // little-endian hosts only (x86-64, aarch64)
    if (header_len > kMaxHeaderSize)
      throw Error(path + ": header length " + std::to_string(header_len) + " exceeds the limit of " +
                  std::to_string(kMaxHeaderSize) + " bytes (not a safetensors file?)");
    if (header_len > size_ - 8)
      throw Error(path + ": header length " + std::to_string(header_len) +
                  " runs past the end of the file (" + std::to_string(size_ - 8) +
                  " bytes after the length field): truncated file?");
    data_start_ = 8 + header_len;
    std::string header(reinterpret_cast<const char*>(base_ + 8), header_len);
    if (header.empty() || header[0] != '{')
      throw Error(path + ": header must be a JSON object starting with '{'");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(header);
    } catch (const std::exception& e) {
      throw Error(path + ": malformed JSON header: " + e.what());
    }
    if (!j.is_object()) throw Error(path + ": header is not a JSON object");

    const uint64_t buffer_size = size_ - data_start_;
    std::vector<const TensorInfo*> by_offset;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it.value().is_object()) throw Error(path + ": __metadata__ must be an object of strings");
        for (auto m = it.value().begin(); m != it.value().end(); ++m)
          metadata_[m.key()] = m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
        continue;
      }
      const std::string where = path + ": tensor \"" + it.key() + "\"";
      const auto& e = it.value();
      if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
        throw Error(where + ": expected an object with dtype, shape and data_offsets");
      TensorInfo info;
      info.name = it.key();
      if (!e["dtype"].is_string()) throw Error(where + ": dtype must be a string");
      info.dtype = e["dtype"].get<std::string>();
      const auto& dt = dtype_entry(info.dtype, where);
      if (!e["shape"].is_array()) throw Error(where + ": shape must be an array");
      for (const auto& d : e["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0)
          throw Error(where + ": shape entries must be non-negative integers, found " + d.dump());
        info.shape.push_back(d.get<int64_t>());
      }
      const auto& off = e["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        throw Error(where + ": data_offsets must be [begin, end], found " + off.dump());
      info.begin = off[0].get<uint64_t>();
      info.end = off[1].get<uint64_t>();
      if (info.end < info.begin)
        throw Error(where + ": data_offsets end " + std::to_string(info.end) + " is before begin " +
                    std::to_string(info.begin));
      if (info.end > buffer_size)
        throw Error(where + ": data_offsets [" + std::to_string(info.begin) + ", " +
                    std::to_string(info.end) + "] out of range: the data buffer has " +
                    std::to_string(buffer_size) + " bytes (truncated file?)");
      const uint64_t expected = static_cast<uint64_t>(numel_of(info.shape)) * dt.size;
      if (info.end - info.begin != expected)
        throw Error(where + ": shape " + shape_string(info.shape) + " of " + info.dtype + " needs " +
                    std::to_string(expected) + " bytes, but data_offsets span " +
                    std::to_string(info.end - info.begin));
      auto [pos, inserted] = tensors_.emplace(info.name, info);
      if (!inserted) throw Error(where + ": duplicate tensor name");
      by_offset.push_back(&pos->second);
    }
    std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
      return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    uint64_t prev_end = 0;
    const TensorInfo* prev = nullptr;
    for (const TensorInfo* t : by_offset) {
      if (t->begin < prev_end)
        throw Error(path + ": tensor \"" + t->name + "\" [" + std::to_string(t->begin) + ", " +
                    std::to_string(t->end) + "] overlaps tensor \"" + prev->name + "\" [" +
                    std::to_string(prev->begin) + ", " + std::to_string(prev->end) + "]");
      if (t->begin > prev_end)
        throw Error(path + ": bytes [" + std::to_string(prev_end) + ", " + std::to_string(t->begin) +
                    ") before tensor \"" + t->name + "\" belong to no tensor (the buffer must be fully indexed)");
      prev_end = t->end;
      prev = t;
    }
    if (prev_end != buffer_size)
      throw Error(path + ": the data buffer has " + std::to_string(buffer_size) +
                  " bytes but the tensors cover " + std::to_string(prev_end) +
                  " (trailing bytes or a wrong header)");
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(base_), size_);
    base_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<const TensorInfo*> v;
  for (const auto& [n, t] : tensors_) v.push_back(&t);
  std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  std::vector<std::string> out;
  for (auto* t : v) out.push_back(t->name);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error(path_ + ": missing tensor \"" + name + "\"");
  return it->second;
}

torch::Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo& t = info(name);
  auto type = safetensors_dtype(t.dtype, path_);
  auto out = torch::empty(t.shape, torch::TensorOptions().dtype(type));
  const size_t bytes = t.end - t.begin;
  if (bytes) std::memcpy(out.data_ptr(), base_ + data_start_ + t.begin, bytes);  // copy: never alias the map
  return out;
}

WeightStore::WeightStore(const std::string& folder_or_file) : location_(folder_or_file) {
  namespace fs = std::filesystem;
  std::vector<std::string> paths;
  if (fs::is_directory(folder_or_file)) {
    fs::path dir(folder_or_file);
    fs::path index = dir / "model.safetensors.index.json";
    fs::path single = dir / "model.safetensors";
    if (fs::exists(single)) {
      paths.push_back(single.string());
    } else if (fs::exists(index)) {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(read_file(index.string()));
      } catch (const nlohmann::json::exception& e) {
        throw Error(index.string() + ": malformed JSON: " + e.what());
      }
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        throw Error(index.string() + ": missing field \"weight_map\" (expected {tensor: file})");
      std::vector<std::string> shard_names;
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string()) throw Error(index.string() + ": weight_map[\"" + it.key() + "\"] must be a file name");
        const std::string name = it.value().get<std::string>();
        // Shards live in the folder itself: a path elsewhere (absolute, or climbing out) is refused.
        if (name.empty() || fs::path(name).has_parent_path() || name == "." || name == "..")
          throw Error(index.string() + ": weight_map[\"" + it.key() + "\"] names \"" + name +
                      "\"; expected a file name in the model's folder");
        shard_names.push_back(name);
      }
      std::sort(shard_names.begin(), shard_names.end());
      shard_names.erase(std::unique(shard_names.begin(), shard_names.end()), shard_names.end());
      for (auto& s : shard_names) paths.push_back((dir / s).string());
      if (paths.empty()) throw Error(index.string() + ": weight_map lists no files");
    } else {
      throw Error(folder_or_file + ": no model.safetensors or model.safetensors.index.json in this folder");
    }
  } else if (fs::exists(folder_or_file)) {
    paths.push_back(folder_or_file);
  } else {
    throw Error(folder_or_file + ": no such file or folder");
  }
  for (const auto& p : paths) {
    files_.push_back(std::make_unique<SafetensorsFile>(p));
    for (const auto& name : files_.back()->names()) {
      if (where_.count(name))
        throw Error(p + ": tensor \"" + name + "\" also appears in " + files_[where_[name]]->path());
      where_[name] = files_.size() - 1;
    }
  }
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  for (const auto& [n, i] : where_) out.push_back(n);
  return out;
}

const SafetensorsFile& WeightStore::file_for(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) {
    const std::string where = files_.size() == 1 ? files_[0]->path() : location_ + "/model.safetensors.index.json";
    throw Error(where + ": missing tensor \"" + name + "\"");
  }
  return *files_[it->second];
}

const TensorInfo& WeightStore::info(const std::string& name) const { return file_for(name).info(name); }

std::string WeightStore::file_of(const std::string& name) const { return file_for(name).path(); }

torch::Tensor WeightStore::get(const std::string& name) const { return file_for(name).get(name); }

torch::Tensor WeightStore::get(const std::string& name, torch::ScalarType dtype,
                               const std::vector<int64_t>& expected_shape) const {
  const auto& file = file_for(name);
  const auto& t = file.info(name);
  if (!expected_shape.empty() && t.shape != expected_shape)
    throw Error(file.path() + ": tensor \"" + name + "\" has shape " + shape_string(t.shape) +
                ", expected " + shape_string(expected_shape));
  return file.get(name).to(dtype);
}

void require_finite(const std::vector<std::pair<std::string, torch::Tensor>>& tensors, const std::string& what) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : tensors)
    if (t.is_floating_point() && t.numel() > 0 && !torch::isfinite(t).all().item<bool>())
      throw Error(what + ": tensor " + name + " holds NaN or inf values; refusing to write it");
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      std::map<std::string, std::string> metadata) {
  struct Item {
    std::string name;
    torch::Tensor data;  // contiguous CPU
    int elem;
  };
  std::vector<Item> items;
  for (const auto& [name, t] : tensors) {
    auto c = t.detach().to(torch::kCPU).contiguous();
    items.push_back({name, c, static_cast<int>(c.element_size())});
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.elem != b.elem ? a.elem > b.elem : a.name < b.name;
  });
  if (!metadata.count("format")) metadata["format"] = "pt";
  nlohmann::ordered_json header;
  header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& it : items) {
    if (header.contains(it.name)) throw Error(path + ": duplicate tensor name \"" + it.name + "\"");
    const uint64_t bytes = static_cast<uint64_t>(it.data.numel()) * it.elem;
    header[it.name] = {{"dtype", safetensors_dtype_name(it.data.scalar_type())},
                       {"shape", it.data.sizes().vec()},
                       {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');
  write_file_atomic(path, [&](std::ostream& out) {
    uint64_t n = h.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    for (const auto& it : items)
      out.write(static_cast<const char*>(it.data.data_ptr()),
                static_cast<std::streamsize>(it.data.numel() * it.elem));
  });
}

}  // namespace linearize
