#include "core/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/checksum.h"

namespace myriad {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = (fs::path(::testing::TempDir()) /
            ("myriad_st_" + std::to_string(::getpid()) + "_" + info->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  static void WriteRaw(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  static std::string ReadRaw(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // A file made by hand: u64 length, `header` verbatim, then `data`.
  static std::string Handmade(const std::string& header, const std::string& data) {
    std::string out(8, '\0');
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + header + data;
  }
  std::string OpenError(const std::string& bytes) {
    const std::string path = Path("bad.safetensors");
    WriteRaw(path, bytes);
    auto f = SafetensorsFile::Open(path);
    EXPECT_FALSE(f.ok());
    return f.ok() ? std::string() : f.status().message();
  }

  std::string dir_;
};

bool HavePythonWithNumpy() {
  return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

TEST_F(SafetensorsTest, RoundTripSeveralDtypes) {
  std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, 1e-30f, -7.0f};
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x7bff};       // 1, -2, 65504
  std::vector<uint16_t> bf16 = {0x3f80, 0x4040, 0xbf00, 0x0}; // 1, 3, -0.5, 0
  std::vector<int32_t> i32 = {-1, 2, -3};
  std::vector<int64_t> i64 = {int64_t{1} << 40, -5};
  std::vector<int8_t> i8 = {-128, 0, 127};
  std::vector<uint8_t> u8 = {0, 1, 255, 7, 9};
  std::vector<uint16_t> u16 = {65535, 1};
  std::vector<uint32_t> u32 = {4000000000u};
  int64_t scalar = 42;
  std::vector<TensorView> in = {
      {"w.f32", "F32", {2, 3}, f32.data(), f32.size() * 4},
      {"w.f16", "F16", {3}, f16.data(), f16.size() * 2},
      {"w.bf16", "BF16", {2, 2}, bf16.data(), bf16.size() * 2},
      {"w.i32", "I32", {3, 1}, i32.data(), i32.size() * 4},
      {"w.i64", "I64", {2}, i64.data(), i64.size() * 8},
      {"w.i8", "I8", {3}, i8.data(), i8.size()},
      {"w.u8", "U8", {5}, u8.data(), u8.size()},
      {"w.u16", "U16", {1, 2}, u16.data(), u16.size() * 2},
      {"w.u32", "U32", {1}, u32.data(), u32.size() * 4},
      {"step", "I64", {}, &scalar, 8},
      {"empty", "F32", {0, 4}, nullptr, 0},
  };
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "héllo \"quoted\""}};
  const std::string path = Path("rt.safetensors");
  WrittenFileInfo info;
  ASSERT_TRUE(WriteSafetensors(Env::Default(), path, in, meta, &info).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  const std::string bytes = ReadRaw(path);
  EXPECT_EQ(info.size, bytes.size());
  EXPECT_EQ(info.checksum, Checksum64(bytes));
  EXPECT_EQ(bytes, SerializeSafetensors(in, meta));
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u) << "data section must start 8-byte aligned";

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->metadata(), meta);
  ASSERT_EQ(f->tensors().size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const TensorView& got = f->tensors()[i];  // offset order == writing order
    EXPECT_EQ(got.name, in[i].name);
    EXPECT_EQ(got.dtype, in[i].dtype);
    EXPECT_EQ(got.shape, in[i].shape);
    ASSERT_EQ(got.nbytes, in[i].nbytes);
    if (got.nbytes) {
      EXPECT_EQ(std::memcmp(got.data, in[i].data, got.nbytes), 0) << got.name;
    }
    EXPECT_EQ(f->Find(in[i].name), &got);
  }
  EXPECT_EQ(f->Find("nope"), nullptr);

  // Views survive a move of the file object.
  const void* before = f->Find("w.f32")->data;
  SafetensorsFile moved = std::move(f.value());
  EXPECT_EQ(moved.Find("w.f32")->data, before);
  auto vals = ReadF32(moved, "w.f32", {2, 3});
  ASSERT_TRUE(vals.ok()) << vals.status().message();
  EXPECT_EQ(*vals, f32);
}

TEST_F(SafetensorsTest, OverwriteIsAtomicAndEmptyFileWorks) {
  const std::string path = Path("x.safetensors");
  float a = 1.0f;
  ASSERT_TRUE(WriteSafetensors(Env::Default(), path, {{"a", "F32", {1}, &a, 4}}, {}).ok());
  ASSERT_TRUE(WriteSafetensors(Env::Default(), path, {}, {}).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_TRUE(f->metadata().empty());
}

TEST_F(SafetensorsTest, WriterRejectsBadViews) {
  float a[2] = {1, 2};
  const std::string path = Path("w.safetensors");
  auto err = [&](std::vector<TensorView> v) {
    Status s = WriteSafetensors(Env::Default(), path, v, {});
    EXPECT_FALSE(s.ok());
    EXPECT_FALSE(fs::exists(path));
    return s.message();
  };
  EXPECT_NE(err({{"a", "F32", {3}, a, 8}}).find("needs 12 bytes but the view has 8"),
            std::string::npos);
  EXPECT_NE(err({{"a", "F99", {2}, a, 8}}).find("unknown dtype \"F99\""), std::string::npos);
  EXPECT_NE(err({{"a", "F32", {2}, a, 8}, {"a", "F32", {2}, a, 8}}).find("duplicate name"),
            std::string::npos);
  EXPECT_NE(err({{"__metadata__", "F32", {2}, a, 8}}).find("__metadata__"), std::string::npos);
  EXPECT_NE(err({{"a", "F32", {2}, nullptr, 8}}).find("data is null"), std::string::npos);
  // Errors name the file.
  EXPECT_EQ(err({{"a", "F32", {3}, a, 8}}).rfind(path + ": ", 0), 0u);

  Status s = WriteSafetensors(Env::Default(), Path("no/such/dir/x.safetensors"),
                              {{"a", "F32", {2}, a, 8}}, {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no/such/dir/x.safetensors.tmp"), std::string::npos) << s.message();
}

TEST_F(SafetensorsTest, CorruptFilesGiveClearErrors) {
  const std::string path = Path("bad.safetensors");
  auto has = [](const std::string& msg, const std::string& what) {
    EXPECT_NE(msg.find(what), std::string::npos) << "message: " << msg << "\nwanted: " << what;
    return msg;
  };
  std::string m;

  m = has(OpenError("abc"), "file is 3 bytes, shorter than the 8-byte header length");
  EXPECT_EQ(m.rfind(path + ": ", 0), 0u) << "error must start with the file name: " << m;
  has(m, "hint:");

  std::string beyond = Handmade("{}", "");
  beyond[0] = 100;  // claims 100 header bytes, has 2
  has(OpenError(beyond), "header length 100 goes beyond the end of the file (10 bytes)");

  has(OpenError(Handmade("{\"a\": [1, 2", "")), "header is not a valid JSON object");
  has(OpenError(Handmade("[1, 2]", "")), "header is not a valid JSON object");

  has(OpenError(Handmade(R"({"a":{"dtype":"F48","shape":[1],"data_offsets":[0,6]}})",
                         std::string(6, '\0'))),
      "tensor a has unknown dtype \"F48\"");

  has(OpenError(Handmade(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})",
                         std::string(16, '\0'))),
      "tensor a: dtype F32 and shape [2, 2] need 16 bytes but data_offsets [0, 12) hold 12");

  has(OpenError(Handmade(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                         std::string(12, '\0'))),
      "tensor a: data_offsets [0, 16) lie beyond the data section of 12 bytes");

  has(OpenError(Handmade(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                         std::string(12, '\0'))),
      "tensor b (bytes [4, 12)) overlaps tensor a");

  has(OpenError(Handmade(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
                         std::string(8, '\0'))),
      "has a dimension that is not a non-negative integer");

  has(OpenError(Handmade(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})",
                         std::string(8, '\0'))),
      "is not a pair [begin, end) with begin <= end");

  has(OpenError(Handmade(R"({"a":{"dtype":"F32","shape":[2]}})", std::string(8, '\0'))),
      "needs dtype, shape and data_offsets");

  has(OpenError(Handmade(R"({"__metadata__":{"k":1}})", "")),
      "__metadata__ value for \"k\" is not a string");

  auto missing = SafetensorsFile::Open(Path("does_not_exist.safetensors"));
  ASSERT_FALSE(missing.ok());
  has(missing.status().message(), "does_not_exist.safetensors: cannot open");
  auto dir = SafetensorsFile::Open(dir_);
  ASSERT_FALSE(dir.ok());
  has(dir.status().message(), "not a regular file");
}

TEST_F(SafetensorsTest, TrailingBytesAndGapsAreTolerated) {
  // a at [8,16), b at [0,4): out of header order, a gap at [4,8), then garbage.
  std::string data(16, '\0');
  float a[2] = {5.0f, 6.0f};
  int32_t b = -9;
  std::memcpy(&data[8], a, 8);
  std::memcpy(&data[0], &b, 4);
  const std::string path = Path("loose.safetensors");
  WriteRaw(path, Handmade(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                          R"("b":{"dtype":"I32","shape":[],"data_offsets":[0,4]}})",
                          data + "trailing garbage"));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  ASSERT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->tensors()[0].name, "b");  // offset order
  EXPECT_EQ(f->tensors()[1].name, "a");
  auto av = ReadF32(*f, "a", {2});
  ASSERT_TRUE(av.ok());
  EXPECT_EQ((*av)[0], 5.0f);
  EXPECT_EQ((*av)[1], 6.0f);
}

TEST_F(SafetensorsTest, ReadF32Errors) {
  std::vector<float> w(64, 1.0f);
  uint16_t h[2] = {0, 0};
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(Env::Default(), path,
                               {{"model.norm.weight", "F32", {64}, w.data(), 256},
                                {"model.half", "F16", {2}, h, 4}},
                               {})
                  .ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok());

  auto r = ReadF32(*f, "model.norm.weight", {32});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            path + ": tensor model.norm.weight has shape [64] but the config expects [32] "
                   "(hint: the checkpoint was written for another model config)");

  r = ReadF32(*f, "model.norm.weigth", {64});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no tensor named model.norm.weigth"), std::string::npos);
  EXPECT_NE(r.status().message().find("did you mean model.norm.weight?"), std::string::npos)
      << r.status().message();

  r = ReadF32(*f, "model.half", {2});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("has dtype F16 but F32 is required"), std::string::npos);
}

// An independent writer: the format written by hand with Python's struct and
// json modules and numpy, with an unpadded header (so the data is unaligned).
TEST_F(SafetensorsTest, ReadsFileFromIndependentPythonWriter) {
  if (!fs::exists("/usr/bin/python3") || !HavePythonWithNumpy()) {
    GTEST_SKIP() << "/usr/bin/python3 with numpy not available";
  }
  const std::string script = Path("write.py");
  const std::string out = Path("py.safetensors");
  WriteRaw(script, R"PY(
import json, struct, sys
import numpy as np
tensors = {
    "embed.weight": np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5 - 1.0,
    "layers.0.bias": np.array([-1.0, 2.5], dtype=np.float16),
    "positions": np.array([[1, -2, 3]], dtype=np.int64),
    "mask": np.array([1, 0, 1, 1, 0], dtype=np.uint8),
}
codes = {np.float32: "F32", np.float16: "F16", np.int64: "I64", np.uint8: "U8"}
header = {"__metadata__": {"format": "np", "writer": "python"}}
blob = b""
for name, arr in tensors.items():
    raw = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
    header[name] = {"dtype": codes[arr.dtype.type], "shape": list(arr.shape),
                    "data_offsets": [len(blob), len(blob) + len(raw)]}
    blob += raw
h = json.dumps(header).encode() + b" "
if (8 + len(h)) % 4 == 0:
    h += b" "  # keep the data section misaligned on purpose
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + blob + b"\x00junk")
)PY");
  ASSERT_EQ(std::system(("/usr/bin/python3 " + script + " " + out).c_str()), 0);

  auto f = SafetensorsFile::Open(out);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->metadata().at("writer"), "python");
  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->tensors()[0].name, "embed.weight");

  auto embed = ReadF32(*f, "embed.weight", {3, 4});
  ASSERT_TRUE(embed.ok()) << embed.status().message();
  for (int i = 0; i < 12; ++i) EXPECT_EQ((*embed)[i], i * 0.5f - 1.0f);

  const TensorView* bias = f->Find("layers.0.bias");
  ASSERT_NE(bias, nullptr);
  EXPECT_EQ(bias->dtype, "F16");
  uint16_t hb[2];
  std::memcpy(hb, bias->data, 4);
  EXPECT_EQ(hb[0], 0xbc00);  // -1.0 in IEEE half
  EXPECT_EQ(hb[1], 0x4100);  // 2.5

  const TensorView* pos = f->Find("positions");
  ASSERT_NE(pos, nullptr);
  EXPECT_EQ(pos->shape, (std::vector<int64_t>{1, 3}));
  int64_t p[3];
  std::memcpy(p, pos->data, 24);
  EXPECT_EQ(p[0], 1);
  EXPECT_EQ(p[1], -2);
  EXPECT_EQ(p[2], 3);

  const TensorView* mask = f->Find("mask");
  ASSERT_NE(mask, nullptr);
  EXPECT_EQ(mask->nbytes, 5u);
  EXPECT_EQ(std::memcmp(mask->data, "\x01\x00\x01\x01\x00", 5), 0);
}

// The other direction: an independent reader (Python, by hand) checks our file.
TEST_F(SafetensorsTest, IndependentPythonReaderAcceptsOurFile) {
  if (!fs::exists("/usr/bin/python3") || !HavePythonWithNumpy()) {
    GTEST_SKIP() << "/usr/bin/python3 with numpy not available";
  }
  std::vector<float> w(6);
  for (int i = 0; i < 6; ++i) w[i] = 0.25f * i - 0.5f;
  std::vector<int32_t> ids = {7, -8, 9};
  const std::string file = Path("ours.safetensors");
  ASSERT_TRUE(WriteSafetensors(Env::Default(), file,
                               {{"w", "F32", {2, 3}, w.data(), 24},
                                {"ids", "I32", {3}, ids.data(), 12}},
                               {{"format", "pt"}})
                  .ok());
  const std::string script = Path("read.py");
  WriteRaw(script, R"PY(
import json, struct, sys
import numpy as np
data = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n])
body = data[8 + n:]
assert header["__metadata__"] == {"format": "pt"}, header
def get(name, dt):
    e = header[name]
    b, end = e["data_offsets"]
    return np.frombuffer(body[b:end], dtype=dt).reshape(e["shape"])
assert header["w"]["dtype"] == "F32" and header["ids"]["dtype"] == "I32"
w = get("w", "<f4")
assert np.array_equal(w, (np.arange(6, dtype=np.float32) * 0.25 - 0.5).reshape(2, 3)), w
assert get("ids", "<i4").tolist() == [7, -8, 9]
assert header["ids"]["data_offsets"][0] == header["w"]["data_offsets"][1]
)PY");
  EXPECT_EQ(std::system(("/usr/bin/python3 " + script + " " + file).c_str()), 0);
}

}  // namespace
}  // namespace myriad
