// Model directory loader and model-level validator. See checkpoint.h for the contract.
#include "format/checkpoint.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <new>
#include <set>
#include <sstream>
#include <unordered_set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/check.h"
#include "common/json_text.h"
#include "io/read_file.h"

namespace ktier::format {

const char* expert_storage_name(ExpertStorage s) {
  switch (s) {
    case ExpertStorage::kNone: return "none";
    case ExpertStorage::kMxfp4: return "MXFP4";
    case ExpertStorage::kPlainFloat: return "plain float";
  }
  return "?";
}

std::string layer_prefix(int64_t layer) {
  return "language_model.model.layers." + std::to_string(layer) + ".";
}
std::string expert_prefix(int64_t layer, int64_t e) {
  return layer_prefix(layer) + "block_sparse_moe.experts." + std::to_string(e) + ".";
}

std::optional<TensorRef> Checkpoint::find(std::string_view name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

const ExpertLocation& Checkpoint::expert(int64_t layer, int64_t e) const {
  KTIER_CHECK(layer >= config_.first_k_dense_replace && layer < config_.num_hidden_layers);
  KTIER_CHECK(e >= 0 && e < config_.num_experts);
  return experts_.at(static_cast<size_t>((layer - config_.first_k_dense_replace) *
                                             config_.num_experts + e));
}

namespace {

using json = nlohmann::json;
using Shape = std::vector<int64_t>;

constexpr size_t kMaxListedProblems = 25;
constexpr std::string_view kLayersPrefix = "language_model.model.layers.";

bool is_float(DType d) { return d == DType::kF32 || d == DType::kBF16 || d == DType::kF16; }

// Collects problems; open() reports them all at once (capped, with a count of the rest, which
// are counted, not kept).
class Problems {
 public:
  void add(std::string msg) {
    if (list_.size() < kMaxListedProblems) list_.push_back(std::move(msg));
    ++count_;
  }
  bool empty() const { return count_ == 0; }
  Status corrupt(const std::string& header) const {
    std::string msg = count_ == 1 ? header + ": " + list_[0]
                                  : header + ": " + std::to_string(count_) + " problems:";
    if (count_ > 1) {
      for (const std::string& m : list_) msg += "\n  " + m;
      if (count_ > list_.size())
        msg += "\n  ... and " + std::to_string(count_ - list_.size()) + " more";
    }
    return Status::corrupt(msg);
  }

 private:
  std::vector<std::string> list_;  // the first kMaxListedProblems
  uint64_t count_ = 0;
};

// Shard file names must be plain names inside the model directory.
bool is_plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

// model.safetensors.index.json: the members ktier uses.
struct IndexFile {
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor name -> shard file, in file order
  std::optional<uint64_t> total_size;                            // metadata.total_size
  std::string ktier_synth;  // metadata.ktier_synth: "shapes-only" from `synth --shapes-only`
};

// Streams the index (nlohmann SAX): the release's has 497,220 entries in 57 MB, and a DOM of it
// costs twice the time and several times the memory. Other members are skipped.
class IndexSax final : public nlohmann::json_sax<json> {
 public:
  explicit IndexSax(std::string file) : file_(std::move(file)) {}
  IndexFile out;
  bool saw_weight_map = false;
  Status error;

  bool null() override {
    // A null total_size is an absent one (informative: an index without it is read).
    if (skip_ == 0 && level_ == 2 && section_ == kMetadata && key2_ == "total_size") return true;
    return scalar("null");
  }
  bool boolean(bool v) override { return scalar(v ? "true" : "false"); }
  bool number_integer(number_integer_t v) override {
    if (v >= 0) return number_unsigned(static_cast<number_unsigned_t>(v));
    return scalar(std::to_string(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (skip_ == 0 && level_ == 2 && section_ == kMetadata && key2_ == "total_size") {
      out.total_size = v;
      return true;
    }
    return scalar(std::to_string(v));
  }
  bool number_float(number_float_t, const string_t& text) override { return scalar(text); }
  bool string(string_t& v) override {
    if (skip_ == 0 && level_ == 2 && section_ == kWeightMap) {
      out.weight_map.emplace_back(std::move(key2_), v);
      return true;
    }
    if (skip_ == 0 && level_ == 2 && section_ == kMetadata && key2_ == "ktier_synth") {
      out.ktier_synth = v;
      return true;
    }
    return scalar("\"" + v + "\"");
  }
  bool binary(binary_t&) override { return scalar("binary"); }
  bool start_object(std::size_t) override { return open_container(true); }
  bool start_array(std::size_t) override { return open_container(false); }
  bool end_object() override { return close_container(); }
  bool end_array() override { return close_container(); }
  bool key(string_t& k) override {
    if (skip_ == 0 && level_ == 1) key1_ = k;
    if (skip_ == 0 && level_ == 2) key2_ = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return fail(std::string("not valid JSON: ") + e.what());
  }

 private:
  enum Section { kOther, kWeightMap, kMetadata };

  bool fail(const std::string& msg) {
    if (error.is_ok()) error = Status::corrupt(file_ + ": " + msg);
    return false;
  }
  std::string where() const {
    return section_ == kWeightMap ? "weight_map['" + key2_ + "']" : "metadata." + key2_;
  }
  bool scalar(const std::string& text) {
    if (skip_ > 0) return true;
    if (level_ == 0) return fail("is " + text + ", expected a JSON object");
    if (level_ == 1 && (key1_ == "weight_map" || key1_ == "metadata"))
      return fail(key1_ + " is " + text + ", expected an object");
    if (level_ == 2 && section_ == kWeightMap)
      return fail(where() + " is " + text + ", expected a shard file name");
    if (level_ == 2 && key2_ == "total_size")
      return fail("metadata.total_size is " + text + ", expected a non-negative integer");
    return true;
  }
  bool open_container(bool object) {
    const std::string what = object ? "an object" : "an array";
    if (skip_ > 0) return ++skip_, true;
    if (level_ == 0) {
      if (!object) return fail("is an array, expected a JSON object");
      level_ = 1;
      return true;
    }
    if (level_ == 1) {
      section_ = key1_ == "weight_map" ? kWeightMap : key1_ == "metadata" ? kMetadata : kOther;
      if (section_ == kOther) return ++skip_, true;
      if (!object) return fail(key1_ + " is an array, expected an object");
      saw_weight_map = saw_weight_map || section_ == kWeightMap;
      level_ = 2;
      return true;
    }
    if (section_ == kWeightMap) return fail(where() + " is " + what + ", expected a shard file name");
    if (key2_ == "total_size") return fail("metadata.total_size is " + what + ", expected an integer");
    return ++skip_, true;
  }
  bool close_container() {
    if (skip_ > 0) return --skip_, true;
    if (level_ > 0) --level_;
    return true;
  }

  std::string file_;
  int level_ = 0;  // 0 outside, 1 in the root object, 2 in weight_map or metadata
  int skip_ = 0;   // > 0 while inside a value that is ignored
  Section section_ = kOther;
  std::string key1_, key2_;
};

Result<IndexFile> read_index(const std::filesystem::path& path) {
  // K3's index names ~500k tensors in ~50 MB; 256 MiB holds any checkpoint's.
  KTIER_ASSIGN_OR_RETURN(const std::string body,
                         io::read_regular_file(path, {uint64_t{256} << 20, &Status::corrupt}));
  if (const std::string nul = json_nul_problem(body); !nul.empty())
    return Status::corrupt(path.string() + ": not valid JSON: it " + nul);
  IndexSax sax(path.string());
  const bool ok = json::sax_parse(body, &sax);
  if (!sax.error.is_ok()) return sax.error;
  if (!ok) return Status::corrupt(path.string() + ": not valid JSON");
  if (!sax.saw_weight_map) return Status::corrupt(path.string() + ": has no \"weight_map\" object");
  return std::move(sax.out);
}

// The one file of a single-file checkpoint (no index): "model.safetensors" or
// "model-00001-of-00001.safetensors", whichever exists first; "" when neither does.
Result<std::string> single_file_name(const std::filesystem::path& dir) {
  for (const char* name : {"model.safetensors", "model-00001-of-00001.safetensors"}) {
    KTIER_ASSIGN_OR_RETURN(const bool exists, io::path_exists(dir / name));
    if (exists) return std::string(name);
  }
  return std::string();
}

}  // namespace

// Does the work of Checkpoint::open(); a friend so that it can fill the private members.
class CheckpointBuilder {
 public:
  CheckpointBuilder(Checkpoint& ck) : ck_(ck), cfg_(ck.config_) {}

  Status discover_and_open(OpenMode mode);
  Status validate_model();

 private:
  Status check_index(const IndexFile& index, const std::vector<std::string>& files);
  std::string where(const TensorRef& r) const {
    return "shard " + ck_.shards_[r.shard].path().filename().string();
  }
  void consume(const TensorRef& r) {
    const auto& ts = ck_.shards_[r.shard].tensors();
    consumed_[r.shard][static_cast<size_t>(r.info - ts.data())] = 1;
  }
  // Tries the shard of the previous hit first: a layer's tensors sit together, and one shard's
  // table stays in cache where the global one (~500k names for K3) does not.
  std::optional<TensorRef> lookup(const std::string& name) {
    if (hint_ < ck_.shards_.size())
      if (const TensorInfo* t = ck_.shards_[hint_].find(name)) return TensorRef{hint_, t};
    auto r = ck_.find(name);
    if (r) hint_ = r->shard;
    return r;
  }
  // Claims a non-expert tensor, counts it under `kind` and checks dtype and shape against the
  // accepted `shapes`. Returns it when it is usable, else records a problem and returns null.
  const TensorInfo* expect(const std::string& name, const std::vector<Shape>& shapes,
                           CensusEntry& kind);
  void expect_a_log(const std::string& name);
  void expect_expert(int64_t layer, int64_t e);
  void check_leftovers();
  void summarise_experts();

  Checkpoint& ck_;
  const ModelConfig& cfg_;
  Problems problems_;
  Status io_error_ = Status::ok();  // the first read that failed (exit 1 before any problem)
  std::vector<std::vector<uint8_t>> consumed_;  // [shard][tensor index in that shard]
  std::string first_packed_, first_plain_;      // first expert tensor of each storage seen
  uint32_t hint_ = 0;                           // shard of the last lookup() hit
};

Status CheckpointBuilder::discover_and_open(OpenMode mode) {
  const std::filesystem::path& dir = ck_.dir_;
  const std::string dir_name = dir.string();
  std::error_code ec;
  std::vector<std::string> files;
  std::optional<IndexFile> index;
  const auto index_path = dir / kIndexFileName;
  KTIER_ASSIGN_OR_RETURN(const bool has_index, io::path_exists(index_path));
  if (has_index) {
    KTIER_ASSIGN_OR_RETURN(index, read_index(index_path));
    std::map<std::string, std::string> example;  // shard file -> one tensor mapped to it
    for (const auto& [tensor, file] : index->weight_map) {
      if (!is_plain_file_name(file))
        return Status::corrupt(index_path.string() + ": weight_map['" + tensor + "'] is \"" + file +
                               "\", expected a shard file name in " + dir_name);
      example.try_emplace(file, tensor);
    }
    for (const auto& [file, tensor] : example) {
      KTIER_ASSIGN_OR_RETURN(const bool shard_exists, io::path_exists(dir / file));
      if (!shard_exists)
        return Status::corrupt(index_path.string() + ": maps tensor '" + tensor + "' to shard " +
                               file + ", which does not exist in " + dir_name);
      files.push_back(file);
    }
    ck_.has_index_ = true;
    if (index->ktier_synth == "shapes-only")
      spdlog::warn("{} was written by `ktier synth --shapes-only`: every weight is 0 (the shards' "
                   "data are holes), so what it decodes and how fast mean nothing; its layout "
                   "and sizes are real",
                   dir_name);
  } else if (Result<std::string> single = single_file_name(dir); !single.is_ok()) {
    return single.status();
  } else if (!single->empty()) {
    files.push_back(*single);
  } else {
    size_t shards = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
      if (entry.path().extension() == ".safetensors") ++shards;
    if (shards > 0)
      return Status::corrupt(dir_name + ": " + std::to_string(shards) +
                             " safetensors shards but no " + kIndexFileName +
                             " to say which tensor is where");
    return Status::usage(dir_name + ": no weights (expected " + kIndexFileName +
                         ", model.safetensors or model-00001-of-00001.safetensors)");
  }

  for (const auto& file : files) {
    KTIER_ASSIGN_OR_RETURN(auto shard, SafetensorsFile::open(dir / file, mode));
    ck_.shards_.push_back(std::move(shard));
  }

  // Name lookup over all shards; a name in two shards is ambiguous.
  size_t total_tensors = 0;
  for (const auto& shard : ck_.shards_) total_tensors += shard.tensors().size();
  ck_.by_name_.reserve(total_tensors);
  Problems dup;
  for (uint32_t s = 0; s < ck_.shards_.size(); ++s) {
    consumed_.emplace_back(ck_.shards_[s].tensors().size(), 0);
    for (const auto& t : ck_.shards_[s].tensors()) {
      auto [it, inserted] = ck_.by_name_.emplace(std::string_view(t.name), TensorRef{s, &t});
      if (!inserted)
        dup.add("tensor '" + t.name + "' is in both " + where(it->second) + " and shard " +
                ck_.shards_[s].path().filename().string());
    }
  }
  if (!dup.empty()) return dup.corrupt(dir_name);
  if (index) return check_index(*index, files);
  return Status::ok();
}

Status CheckpointBuilder::check_index(const IndexFile& index,
                                      const std::vector<std::string>& files) {
  const std::string name = (ck_.dir_ / kIndexFileName).string();
  Problems p;
  std::unordered_map<std::string_view, uint32_t> shard_of_file;
  for (uint32_t i = 0; i < files.size(); ++i) shard_of_file.emplace(files[i], i);

  // listed[shard][i]: the index names tensor i of that shard (and names it in that shard).
  std::vector<std::vector<uint8_t>> listed;
  for (const auto& shard : ck_.shards_) listed.emplace_back(shard.tensors().size(), 0);
  std::unordered_set<std::string_view> misplaced;  // mapped to a shard whose header lacks them
  for (const auto& [tensor, file] : index.weight_map) {
    const uint32_t s = shard_of_file.at(file);
    if (const TensorInfo* t = ck_.shards_[s].find(tensor)) {
      uint8_t& mark = listed[s][static_cast<size_t>(t - ck_.shards_[s].tensors().data())];
      if (mark) p.add("lists tensor '" + tensor + "' more than once");
      mark = 1;
      continue;
    }
    auto found = ck_.by_name_.find(tensor);
    if (found == ck_.by_name_.end())
      p.add("maps tensor '" + tensor + "' to shard " + file + ", but no shard header has it");
    else
      p.add("maps tensor '" + tensor + "' to shard " + file + ", but it is in the header of " +
            where(found->second));
    misplaced.insert(tensor);
  }
  uint64_t total = 0;
  for (uint32_t s = 0; s < ck_.shards_.size(); ++s) {
    const auto& ts = ck_.shards_[s].tensors();
    for (size_t i = 0; i < ts.size(); ++i) {
      total += ts[i].nbytes;
      // A tensor the index maps to another shard was reported above already.
      if (!listed[s][i] && !misplaced.count(ts[i].name))
        p.add("does not list tensor '" + ts[i].name + "' held by shard " +
              ck_.shards_[s].path().filename().string());
    }
  }
  // total_size is only a cross-check (K3-MODEL §3.3 asks the shard headers to be read and
  // trusted): an index without it (or with null) is read; a wrong one is a disagreement.
  if (index.total_size && *index.total_size != total)
    p.add("metadata.total_size is " + std::to_string(*index.total_size) +
          " but the shards' tensors hold " + std::to_string(total) + " bytes");
  return p.empty() ? Status::ok() : p.corrupt(name);
}

const TensorInfo* CheckpointBuilder::expect(const std::string& name,
                                            const std::vector<Shape>& shapes, CensusEntry& kind) {
  auto want = [&] {
    std::string w = shape_string(shapes[0]);
    for (size_t i = 1; i < shapes.size(); ++i) w += " or " + shape_string(shapes[i]);
    return w;
  };
  auto ref = lookup(name);
  if (!ref) {
    problems_.add("missing tensor '" + name + "' (the config implies shape " + want() + ")");
    return nullptr;
  }
  consume(*ref);
  kind.tensors += 1;
  kind.bytes += ref->info->nbytes;
  const TensorInfo& t = *ref->info;
  bool ok = true;
  if (!is_float(t.dtype)) {
    problems_.add("tensor '" + name + "' (" + where(*ref) + ") is " +
                  std::string(dtype_name(t.dtype)) +
                  "; only routed experts may be packed, other tensors must be F32, BF16 or F16");
    ok = false;
  }
  if (std::find(shapes.begin(), shapes.end(), t.shape) == shapes.end()) {
    problems_.add("tensor '" + name + "' (" + where(*ref) + ") has shape " +
                  shape_string(t.shape) + " but the config implies " + want());
    ok = false;
  }
  return ok ? &t : nullptr;
}

// A_log: any shape with n >= H_k elements; elements H_k..n-1 must be exactly 0 (decision D1).
void CheckpointBuilder::expect_a_log(const std::string& name) {
  auto ref = lookup(name);
  const int64_t hk = cfg_.kda_num_heads;
  if (!ref) {
    problems_.add("missing tensor '" + name + "' (the config implies at least " +
                  std::to_string(hk) + " elements)");
    return;
  }
  consume(*ref);
  ck_.census_.trunk.tensors += 1;
  ck_.census_.trunk.bytes += ref->info->nbytes;
  const TensorInfo& t = *ref->info;
  if (!is_float(t.dtype)) {
    problems_.add("tensor '" + name + "' (" + where(*ref) + ") is " +
                  std::string(dtype_name(t.dtype)) + ", must be F32, BF16 or F16");
    return;
  }
  const int64_t n = t.numel();
  if (n < hk) {
    problems_.add("tensor '" + name + "' (" + where(*ref) + ") has shape " +
                  shape_string(t.shape) + ": " + std::to_string(n) +
                  " elements, fewer than the " + std::to_string(hk) + " KDA heads");
    return;
  }
  if (n == hk) return;
  // The tail past the heads is read a chunk at a time: its size is the file's to say (a sparse
  // shard can declare terabytes), and a check must not hold it all.
  constexpr int64_t kChunkElements = int64_t{1} << 18;
  const uint32_t size = dtype_size(t.dtype);
  std::vector<uint8_t> chunk(static_cast<size_t>(std::min(n - hk, kChunkElements)) * size);
  for (int64_t first = hk; first < n; first += kChunkElements) {
    const int64_t count = std::min(n - first, kChunkElements);
    const Status read = ck_.shards_[ref->shard].read_bytes(
        t.file_offset + static_cast<uint64_t>(first) * size, static_cast<uint64_t>(count) * size,
        chunk.data());
    if (!read.is_ok()) {  // the disk's failure, not the file's
      if (io_error_.is_ok()) io_error_ = read.with_context("tensor '" + name + "'");
      return;
    }
    for (int64_t i = 0; i < count; ++i) {
      const uint8_t* p = chunk.data() + static_cast<size_t>(i) * size;
      float v = 0;
      if (t.dtype == DType::kF32) {
        std::memcpy(&v, p, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, p, 2);
        v = t.dtype == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      if (v != 0.0f) {  // NaN fails too
        std::ostringstream os;
        os.precision(9);
        os << v;
        problems_.add("tensor '" + name + "' (" + where(*ref) + "): element " +
                      std::to_string(first + i) + " is " + os.str() + "; elements " +
                      std::to_string(hk) + ".." + std::to_string(n - 1) + " past the " +
                      std::to_string(hk) + " heads must be exactly 0");
        return;
      }
    }
  }
}

// One routed expert, §5.8. Fills ck_.experts_ for (layer, e).
void CheckpointBuilder::expect_expert(int64_t layer, int64_t e) {
  const std::string prefix = expert_prefix(layer, e);
  const int64_t I = cfg_.moe_intermediate_size, ell = cfg_.routed_expert_hidden_size;
  // Logical [rows, cols] of w1, w2, w3.
  const std::array<Shape, 3> logical = {Shape{I, ell}, Shape{ell, I}, Shape{I, ell}};
  const std::array<const char*, 3> wnames = {"w1", "w2", "w3"};
  ExpertLocation loc;
  bool packed_any = false, plain_any = false, complete = true;
  for (size_t w = 0; w < 3; ++w) {
    const std::string base = prefix + wnames[w] + ".";
    const auto packed = lookup(base + "weight_packed");
    const auto scale = lookup(base + "weight_scale");
    const auto plain = lookup(base + "weight");
    for (const auto& r : {packed, scale, plain})
      if (r) {
        consume(*r);
        ck_.census_.experts.tensors += 1;
        ck_.census_.experts.bytes += r->info->nbytes;
      }
    if (packed && plain) {
      problems_.add("expert matrix '" + base + "*' has both weight_packed and weight (pick one)");
      complete = false;
      continue;
    }
    if (!packed && !plain) {
      problems_.add("missing tensor '" + base + "weight_packed' (or a plain-float '" + base +
                    "weight' of shape " + shape_string(logical[w]) + ")" +
                    (scale ? "; found only its weight_scale" : ""));
      complete = false;
      continue;
    }
    if (plain) {
      plain_any = true;
      if (first_plain_.empty()) first_plain_ = plain->info->name;
      const TensorInfo& t = *plain->info;
      if (scale) problems_.add("tensor '" + scale->info->name + "' has no weight_packed partner");
      if (!is_float(t.dtype))
        problems_.add("tensor '" + t.name + "' (" + where(*plain) + ") is " +
                      std::string(dtype_name(t.dtype)) + "; a plain expert must be F32, BF16 or F16");
      if (t.shape != logical[w])
        problems_.add("tensor '" + t.name + "' (" + where(*plain) + ") has shape " +
                      shape_string(t.shape) + " but the config implies " + shape_string(logical[w]));
      loc.parts[w] = {plain->shard, t.file_offset, t.nbytes, t.dtype};
      continue;
    }
    packed_any = true;
    if (first_packed_.empty()) first_packed_ = packed->info->name;
    if (!scale) {
      problems_.add("missing tensor '" + base + "weight_scale' (partner of " + base +
                    "weight_packed)");
      complete = false;
      continue;
    }
    const TensorInfo& p = *packed->info;
    const TensorInfo& s = *scale->info;
    const std::string pw = "tensor '" + p.name + "' (" + where(*packed) + ")";
    bool ok = true;
    if (p.dtype != DType::kU8) {
      problems_.add("tensor '" + p.name + "' is " + std::string(dtype_name(p.dtype)) +
                    ", MXFP4 nibbles must be U8");
      ok = false;
    }
    // The release stores scales as U8; F8_E8M0 is the same byte (§5.8).
    if (s.dtype != DType::kU8 && s.dtype != DType::kE8M0) {
      problems_.add("tensor '" + s.name + "' is " + std::string(dtype_name(s.dtype)) +
                    ", MXFP4 scales must be U8 or F8_E8M0");
      ok = false;
    }
    if (p.shape.size() != 2 || s.shape.size() != 2) {
      problems_.add(pw + " and its weight_scale must be 2-D, got " + shape_string(p.shape) +
                    " and " + shape_string(s.shape));
      ok = false;
    } else {
      const Shape implied = {p.shape[0], p.shape[1] * 2};
      if (p.shape[0] != s.shape[0] || s.shape[1] * 32 != p.shape[1] * 2) {
        problems_.add(pw + " shape " + shape_string(p.shape) + " does not match its weight_scale " +
                      shape_string(s.shape) +
                      " (same rows and scale_cols x 32 == packed_cols x 2 required)");
        ok = false;
      } else if (implied != logical[w]) {
        problems_.add(pw + " has shape " + shape_string(p.shape) + ", i.e. logical " +
                      shape_string(implied) + ", but the config implies " +
                      shape_string(logical[w]) + " (packed " +
                      shape_string({logical[w][0], logical[w][1] / 2}) + ", scale " +
                      shape_string({logical[w][0], logical[w][1] / 32}) + ")");
        ok = false;
      }
    }
    if (!ok) complete = false;
    loc.parts[2 * w] = {packed->shard, p.file_offset, p.nbytes, p.dtype};
    loc.parts[2 * w + 1] = {scale->shard, s.file_offset, s.nbytes, s.dtype};
  }
  if (packed_any && plain_any)
    problems_.add("expert '" + prefix + "' mixes MXFP4 and plain-float matrices");
  if (!complete) return;

  loc.num_parts = packed_any ? 6 : 3;
  loc.shard = loc.parts[0].shard;
  loc.file_offset = loc.parts[0].file_offset;
  loc.nbytes = 0;
  for (uint32_t i = 0; i < loc.num_parts; ++i) loc.nbytes += loc.parts[i].nbytes;
  loc.contiguous = packed_any;
  for (uint32_t i = 1; packed_any && i < loc.num_parts; ++i)
    if (loc.parts[i].shard != loc.shard ||
        loc.parts[i].file_offset != loc.parts[i - 1].file_offset + loc.parts[i - 1].nbytes)
      loc.contiguous = false;
  ck_.experts_[static_cast<size_t>((layer - cfg_.first_k_dense_replace) * cfg_.num_experts + e)] =
      loc;
}

Status CheckpointBuilder::validate_model() {
  const ModelConfig& c = cfg_;
  const int64_t E = c.hidden_size, V = c.vocab_size, C = c.kda_width(), D = c.kda_head_dim;
  const int64_t Hk = c.kda_num_heads, Hm = c.num_attention_heads, K = c.short_conv_kernel_size;
  const int64_t qk = c.mla_qk_head_dim(), v = c.v_head_dim, ql = c.q_lora_rank, kvl = c.kv_lora_rank;
  const int64_t ell = c.routed_expert_hidden_size, Ne = c.num_experts;
  const int64_t Is = c.shared_expert_width(), Id = c.intermediate_size;
  ByteCensus& census = ck_.census_;

  const std::string M = "language_model.model.";
  expect(M + "embed_tokens.weight", {{V, E}}, census.embeddings_head);
  expect(M + "norm.weight", {{E}}, census.embeddings_head);
  expect(M + "output_attn_res_norm.weight", {{E}}, census.embeddings_head);
  expect(M + "output_attn_res_proj.weight", {{1, E}, {E}}, census.embeddings_head);
  expect("language_model.lm_head.weight", {{V, E}}, census.embeddings_head);

  // Every routed expert is at least three tensors: a config that asks for more experts than the
  // shards could hold is refused before anything is sized by it (a num_experts of 10^7 would
  // otherwise take gigabytes and minutes to report millions of missing tensors).
  uint64_t n_tensors = 0;
  for (const SafetensorsFile& shard : ck_.shards_) n_tensors += shard.tensors().size();
  const uint64_t moe_layers = static_cast<uint64_t>(c.num_moe_layers());
  const bool experts_fit =
      moe_layers == 0 || static_cast<uint64_t>(Ne) <= n_tensors / 3 / moe_layers;
  if (experts_fit)
    ck_.experts_.assign(static_cast<size_t>(c.num_moe_layers() * Ne), ExpertLocation{});
  else
    problems_.add(c.source + " says " + std::to_string(Ne) + " routed experts in each of " +
                  std::to_string(moe_layers) + " MoE layers, but the shards hold only " +
                  std::to_string(n_tensors) + " tensors (an expert is at least 3): num_experts " +
                  "does not match the weights");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string P = layer_prefix(l);
    auto trunk = [&](const std::string& suffix, std::vector<Shape> shapes) {
      expect(P + suffix, shapes, census.trunk);
    };
    trunk("input_layernorm.weight", {{E}});
    trunk("post_attention_layernorm.weight", {{E}});
    trunk("self_attention_res_norm.weight", {{E}});
    trunk("self_attention_res_proj.weight", {{1, E}, {E}});
    trunk("mlp_res_norm.weight", {{E}});
    trunk("mlp_res_proj.weight", {{1, E}, {E}});
    const std::string A = "self_attn.";
    if (c.is_mla(l)) {
      trunk(A + "q_a_proj.weight", {{ql, E}});
      trunk(A + "q_a_layernorm.weight", {{ql}});
      trunk(A + "q_b_proj.weight", {{Hm * qk, ql}});
      trunk(A + "kv_a_proj_with_mqa.weight", {{kvl + c.qk_rope_head_dim, E}});
      trunk(A + "kv_a_layernorm.weight", {{kvl}});
      trunk(A + "kv_b_proj.weight", {{Hm * (c.qk_nope_head_dim + v), kvl}});
      if (c.mla_use_output_gate) trunk(A + "g_proj.weight", {{Hm * v, E}});
      trunk(A + "o_proj.weight", {{E, Hm * v}});
    } else {
      for (const char* x : {"q", "k", "v"}) {
        trunk(A + x + "_proj.weight", {{C, E}});
        trunk(A + x + "_conv1d.weight", {{C, 1, K}, {C, K}});
      }
      trunk(A + "f_a_proj.weight", {{D, E}});
      trunk(A + "f_b_proj.weight", {{C, D}});
      expect_a_log(P + A + "A_log");
      trunk(A + "dt_bias", {{C}});
      trunk(A + "b_proj.weight", {{Hk, E}});
      trunk(A + "g_proj.weight", {{C, E}});
      trunk(A + "o_norm.weight", {{D}});
      trunk(A + "o_proj.weight", {{E, C}});
    }
    if (c.is_dense(l)) {
      trunk("mlp.gate_proj.weight", {{Id, E}});
      trunk("mlp.up_proj.weight", {{Id, E}});
      trunk("mlp.down_proj.weight", {{E, Id}});
      continue;
    }
    const std::string B = "block_sparse_moe.";
    trunk(B + "gate.weight", {{Ne, E}});
    trunk(B + "gate.e_score_correction_bias", {{Ne}});
    trunk(B + "routed_expert_down_proj.weight", {{ell, E}});
    if (c.latent_moe_use_norm) trunk(B + "routed_expert_norm.weight", {{ell}});
    trunk(B + "routed_expert_up_proj.weight", {{E, ell}});
    if (Is > 0) {
      trunk(B + "shared_experts.gate_proj.weight", {{Is, E}});
      trunk(B + "shared_experts.up_proj.weight", {{Is, E}});
      trunk(B + "shared_experts.down_proj.weight", {{E, Is}});
    }
    for (int64_t e = 0; experts_fit && e < Ne; ++e) expect_expert(l, e);
  }

  if (!first_packed_.empty() && !first_plain_.empty())
    problems_.add("routed experts mix MXFP4 ('" + first_packed_ + "') and plain float ('" +
                  first_plain_ + "'); one checkpoint must use one storage (a conversion accident?)");
  if (!first_packed_.empty() && !c.quantization)
    problems_.add("tensor '" + first_packed_ + "' is MXFP4-packed but " + c.source +
                  " has no quantization_config");
  check_leftovers();
  if (!io_error_.is_ok()) return io_error_;
  if (!problems_.empty()) return problems_.corrupt(ck_.dir_.string());
  summarise_experts();
  ck_.used_ = std::move(consumed_);
  return Status::ok();
}

// Every tensor the model walk did not claim: vision and MTP are ignored, anything else under
// language_model.model.layers. is an error (§2.5 rule 9), and so is a packed tensor elsewhere in
// the text model (only routed experts are packed: an lm_head.weight_packed is a conversion that
// was only warned about, beside the float lm_head the loader reads).
void CheckpointBuilder::check_leftovers() {
  size_t other = 0;
  std::string other_example;
  for (uint32_t s = 0; s < ck_.shards_.size(); ++s) {
    const auto& ts = ck_.shards_[s].tensors();
    for (size_t i = 0; i < ts.size(); ++i) {
      if (consumed_[s][i]) continue;
      const TensorInfo& t = ts[i];
      const std::string_view name = t.name;
      const bool packed = name.ends_with(".weight_packed") || name.ends_with(".weight_scale");
      bool ignore = !name.starts_with(kLayersPrefix) &&
                    !(packed && name.starts_with("language_model."));
      if (name.starts_with(kLayersPrefix) && cfg_.num_nextn_predict_layers > 0) {
        const std::string_view rest = name.substr(kLayersPrefix.size());
        int64_t layer = -1;
        auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
        ignore = ec == std::errc() && end != rest.data() && *end == '.' &&
                 layer >= cfg_.num_hidden_layers &&  // the MTP head's layers, and no others
                 layer - cfg_.num_hidden_layers < cfg_.num_nextn_predict_layers;
      }
      if (ignore) {
        ck_.census_.ignored.tensors += 1;
        ck_.census_.ignored.bytes += t.nbytes;
        const bool vision = name.starts_with("vision_tower.") || name.starts_with("mm_projector.");
        if (!vision && !name.starts_with(kLayersPrefix) && other++ == 0) other_example = t.name;
        continue;
      }
      problems_.add("unknown tensor '" + t.name + "' in shard " +
                    ck_.shards_[s].path().filename().string() +
                    (packed ? " (a packed tensor outside the routed experts the config implies)"
                            : " (not implied by the config)"));
    }
  }
  if (other > 0)
    spdlog::warn("{}: ignoring {} tensor(s) outside the text model, e.g. '{}'", ck_.dir_.string(),
                 other, other_example);
}

void CheckpointBuilder::summarise_experts() {
  ExpertSummary& sum = ck_.expert_summary_;
  sum.storage = !first_packed_.empty() ? ExpertStorage::kMxfp4
                : !first_plain_.empty() ? ExpertStorage::kPlainFloat
                                        : ExpertStorage::kNone;
  sum.count = ck_.experts_.size();
  std::set<uint64_t> sizes;
  std::set<DType> dtypes;
  for (const auto& loc : ck_.experts_) {
    sizes.insert(loc.nbytes);
    if (loc.contiguous) ++sum.contiguous;
  }
  sum.bytes_per_expert = sizes.size() == 1 ? *sizes.begin() : 0;
  if (sum.storage == ExpertStorage::kPlainFloat) {
    for (int64_t l = cfg_.first_k_dense_replace; l < cfg_.num_hidden_layers; ++l)
      for (int64_t e = 0; e < cfg_.num_experts; ++e)
        for (const char* w : ExpertLocation::kPlainPartNames)
          dtypes.insert(lookup(expert_prefix(l, e) + w)->info->dtype);
    if (dtypes.size() == 1) sum.plain_dtype = *dtypes.begin();
  }
  if (sum.storage == ExpertStorage::kMxfp4 && sum.contiguous < sum.count)
    spdlog::warn("{}: {} of {} experts are not one contiguous run; they are read tensor by tensor",
                 ck_.dir_.string(), sum.count - sum.contiguous, sum.count);
}

Status Checkpoint::check_directory(const std::filesystem::path& dir) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) return Status::ok();
  KTIER_ASSIGN_OR_RETURN(const bool exists, io::path_exists(dir));
  // A file of a model folder (config.json, a shard) given for the folder: name the folder.
  std::string hint;
  const std::filesystem::path parent = dir.parent_path().empty() ? "." : dir.parent_path();
  if (exists && std::filesystem::is_regular_file(parent / "config.json", ec))
    hint = "; the model is the folder that holds it: " + parent.string();
  return Status::usage(dir.string() + ": not a model directory (" +
                       (exists ? "not a directory" : "no such directory") + ")" + hint);
}

Result<Checkpoint> Checkpoint::open(const std::filesystem::path& dir, OpenMode mode) {
  try {
    KTIER_RETURN_IF_ERROR(check_directory(dir));
    Checkpoint ck;
    ck.dir_ = dir;
    KTIER_ASSIGN_OR_RETURN(ck.config_, load_model_config(dir / "config.json"));
    CheckpointBuilder builder(ck);
    KTIER_RETURN_IF_ERROR(builder.discover_and_open(mode));
    KTIER_RETURN_IF_ERROR(builder.validate_model());
    spdlog::debug("{}: {} shards, {} experts ({})", dir.string(), ck.shards_.size(),
                  ck.expert_summary_.count, expert_storage_name(ck.expert_summary_.storage));
    return ck;
  } catch (const std::bad_alloc&) {
    return Status::out_of_memory(dir.string() + ": out of memory while opening the checkpoint");
  } catch (const std::exception& e) {  // e.g. filesystem errors; never escape
    return Status::runtime(dir.string() + ": " + e.what());
  }
}

}  // namespace ktier::format
