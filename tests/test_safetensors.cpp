// safetensors reader/writer: round trips of every supported dtype, sharded folders, and one test per
// kind of bad input, each checking that the error names the file, the tensor and what was expected.
#include <filesystem>
#include <fstream>

#include "io/error.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace linearize;

namespace {

std::string temp_dir() {
  auto d = fs::temp_directory_path() / ("linearize_st_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d.string();
}

// Writes a file with the given JSON header and `data_bytes` bytes of payload.
std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes,
                      int64_t header_len_override = -1) {
  std::string path = temp_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header_len_override >= 0 ? static_cast<uint64_t>(header_len_override) : header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out << std::string(data_bytes, '\0');
  return path;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Safetensors, RoundTripEveryDtype) {
  std::string path = temp_dir() + "/rt.safetensors";
  torch::manual_seed(0);
  std::vector<std::pair<std::string, torch::Tensor>> ts = {
      {"f32", torch::randn({3, 5})},
      {"f16", torch::randn({7}).to(torch::kHalf)},
      {"bf16", torch::randn({2, 2, 3}).to(torch::kBFloat16)},
      {"i32", torch::arange(10, torch::kInt)},
      {"i64", torch::arange(4, torch::kLong).view({2, 2})},
      {"scalar", torch::tensor(3.5f)},
      {"empty", torch::zeros({0, 4})},
  };
  save_safetensors(path, ts, {{"note", "test"}});
  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("note"), "test");
  for (const auto& [name, t] : ts) {
    auto got = f.get(name);
    EXPECT_EQ(got.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(got.sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(got, t)) << name;
  }
  EXPECT_EQ(f.info("bf16").dtype, "BF16");
  // Tensors start at offsets aligned to their element size (writer orders by element size).
  for (const auto& n : f.names()) {
    const auto& i = f.info(n);
    EXPECT_EQ(i.begin % static_cast<uint64_t>(f.get(n).element_size()), 0u) << n;
  }
}

TEST(Safetensors, WeightStoreConvertsAndChecksShape) {
  std::string path = temp_dir() + "/ws.safetensors";
  save_safetensors(path, {{"w", torch::ones({2, 3}).to(torch::kBFloat16)}});
  WeightStore ws(path);
  auto w = ws.get("w", torch::kFloat, {2, 3});
  EXPECT_EQ(w.scalar_type(), torch::kFloat);
  EXPECT_EQ(w.sum().item<float>(), 6.0f);
  auto msg = error_of([&] { ws.get("w", torch::kFloat, {3, 2}); });
  EXPECT_NE(msg.find("ws.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"w\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected [3, 2]"), std::string::npos) << msg;
  msg = error_of([&] { ws.get("missing.weight", torch::kFloat); });
  EXPECT_NE(msg.find("missing tensor \"missing.weight\""), std::string::npos) << msg;
}

TEST(Safetensors, ShardedFolder) {
  std::string dir = temp_dir() + "/sharded";
  fs::create_directories(dir);
  save_safetensors(dir + "/model-00001-of-00002.safetensors", {{"a", torch::full({2}, 1.0)}});
  save_safetensors(dir + "/model-00002-of-00002.safetensors", {{"b", torch::full({3}, 2.0)}});
  std::ofstream(dir + "/model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})";
  WeightStore ws(dir);
  EXPECT_EQ(ws.names().size(), 2u);
  EXPECT_EQ(ws.get("a", torch::kFloat).sum().item<float>(), 2.0f);
  EXPECT_EQ(ws.get("b", torch::kFloat).sum().item<float>(), 6.0f);
  EXPECT_NE(ws.file_of("b").find("00002"), std::string::npos);
}

TEST(Safetensors, TruncatedFile) {
  std::string path = temp_dir() + "/short.safetensors";
  std::ofstream(path, std::ios::binary) << "abc";
  auto msg = error_of([&] { SafetensorsFile f(path); });
  EXPECT_NE(msg.find("short.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("3 bytes"), std::string::npos) << msg;
}

TEST(Safetensors, TruncatedData) {
  // Header promises 16 bytes of data, file has 8.
  auto path = write_raw("trunc_data.safetensors", R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  auto msg = error_of([&] { SafetensorsFile f(path); });
  EXPECT_NE(msg.find("\"x\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
}

TEST(Safetensors, HeaderLengthPastEnd) {
  auto path = write_raw("hdr.safetensors", R"({"x":1})", 0, 1000);
  auto msg = error_of([&] { SafetensorsFile f(path); });
  EXPECT_NE(msg.find("hdr.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("header length 1000 runs past the end"), std::string::npos) << msg;
}

TEST(Safetensors, OverlappingOffsets) {
  auto path = write_raw("overlap.safetensors",
                        R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                        12);
  auto msg = error_of([&] { SafetensorsFile f(path); });
  EXPECT_NE(msg.find("overlaps"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"a\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"b\""), std::string::npos) << msg;
}

TEST(Safetensors, OutOfRangeOffsets) {
  auto path = write_raw("range.safetensors", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8);
  auto msg = error_of([&] { SafetensorsFile f(path); });
  EXPECT_NE(msg.find("\"a\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("out of range"), std::string::npos) << msg;
  EXPECT_NE(msg.find("8 bytes"), std::string::npos) << msg;
}

TEST(Safetensors, UnknownDtype) {
  auto path = write_raw("dtype.safetensors", R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8);
  auto msg = error_of([&] { SafetensorsFile f(path); });
  EXPECT_NE(msg.find("unknown dtype \"Q4\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"a\""), std::string::npos) << msg;
  auto path2 = write_raw("dtype8.safetensors", R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2);
  msg = error_of([&] { SafetensorsFile f(path2); });
  EXPECT_NE(msg.find("F8_E4M3 is not supported"), std::string::npos) << msg;
}

TEST(Safetensors, ShapeInconsistentWithBytes) {
  auto path = write_raw("bytes.safetensors", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8);
  auto msg = error_of([&] { SafetensorsFile f(path); });
  EXPECT_NE(msg.find("shape [3] of F32 needs 12 bytes, but data_offsets span 8"), std::string::npos) << msg;
}

TEST(Safetensors, HolesAndTrailingBytes) {
  auto path = write_raw("hole.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8);
  auto msg = error_of([&] { SafetensorsFile f(path); });
  EXPECT_NE(msg.find("belong to no tensor"), std::string::npos) << msg;
  auto path2 = write_raw("trail.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8);
  msg = error_of([&] { SafetensorsFile f(path2); });
  EXPECT_NE(msg.find("cover 4"), std::string::npos) << msg;
}

TEST(Safetensors, MalformedHeaderJson) {
  auto path = write_raw("json.safetensors", R"({"a": )", 0);
  auto msg = error_of([&] { SafetensorsFile f(path); });
  EXPECT_NE(msg.find("malformed JSON header"), std::string::npos) << msg;
}
