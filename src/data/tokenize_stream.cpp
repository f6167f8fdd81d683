// Streamed, multi-threaded tokenization into shards (see tokenize_stream.h).
#include "data/tokenize_stream.h"

#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "data/text_stream.h"
#include "data/token_dataset.h"
#include "io/atomic_file.h"
#include "io/error.h"
#include "io/tokenizer.h"

namespace linearize {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void check_regular_file(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) throw Error(path + ": no such file");
  if (!S_ISREG(st.st_mode)) throw Error(path + ": expected a text file, found a folder, FIFO or device");
  const std::string fmt = text_format(path);
  if (fmt != ".txt" && fmt != ".jsonl")
    throw Error(path + ": expected .txt or .jsonl (optionally .gz or .zst), found \"" + fmt + "\"");
}

// Numbered shards, each written to NAME.partial and renamed once full (or at the end).
class ShardWriter {
 public:
  ShardWriter(std::string dir, bool single_file, int64_t shard_tokens)
      : dir_(std::move(dir)), single_(single_file), shard_tokens_(shard_tokens) {}
  ~ShardWriter() {
    if (f_) std::fclose(f_);
  }

  void write(const std::vector<int32_t>& ids, bool document_end) {
    size_t at = 0;
    while (at < ids.size()) {
      if (!f_) open_next();
      const size_t room = single_ ? ids.size() - at : static_cast<size_t>(shard_tokens_ - current_tokens_);
      const size_t n = std::min(room, ids.size() - at);
      if (std::fwrite(ids.data() + at, 4, n, f_) != n) throw Error(current_path() + ".partial: write failed");
      at += n;
      current_tokens_ += static_cast<int64_t>(n);
      if (!single_ && current_tokens_ == shard_tokens_ && (at < ids.size() || !document_end)) close_current();
    }
    if (document_end) {
      if (!f_) open_next();  // an empty document after a full shard still counts in the next one
      ++current_documents_;
      if (!single_ && current_tokens_ == shard_tokens_) close_current();
    }
  }

  // Closes the last shard; returns the index entries.
  nlohmann::json finish() {
    if (f_ || shards_.empty()) {
      if (!f_) open_next();
      close_current();
    }
    return shards_;
  }

 private:
  std::string name(int64_t i) const {
    char b[32];
    std::snprintf(b, sizeof b, "shard-%05lld.u32", static_cast<long long>(i));
    return b;
  }
  std::string current_path() const { return single_ ? dir_ : (fs::path(dir_) / name(shards_.size())).string(); }
  void open_next() {
    f_ = std::fopen((current_path() + ".partial").c_str(), "wb");
    if (!f_) throw Error(current_path() + ".partial: cannot write: " + std::strerror(errno));
    current_tokens_ = current_documents_ = 0;
  }
  void close_current() {
    if (std::fflush(f_) != 0 || fsync(fileno(f_)) != 0) throw Error(current_path() + ".partial: write failed");
    std::fclose(f_);
    f_ = nullptr;
    fs::rename(current_path() + ".partial", current_path());
    shards_.push_back({{"file", fs::path(current_path()).filename().string()},
                       {"tokens", current_tokens_},
                       {"documents", current_documents_}});
  }

  std::string dir_;
  bool single_;
  int64_t shard_tokens_;
  FILE* f_ = nullptr;
  int64_t current_tokens_ = 0, current_documents_ = 0;
  nlohmann::json shards_ = nlohmann::json::array();
};

// A folder that holds shards but no index.json is an interrupted run: its shards go.
void prepare_folder(const std::string& dir) {
  if (fs::exists(fs::path(dir) / "index.json"))
    throw Error(dir + " already holds a tokenized dataset (index.json): remove it or choose another --output");
  if (fs::exists(dir) && !fs::is_directory(dir)) throw Error(dir + ": exists and is not a folder");
  fs::create_directories(dir);
  int64_t removed = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("shard-", 0) == 0 && (ends_with(n, ".u32") || ends_with(n, ".u32.partial"))) {
      fs::remove(e.path());
      ++removed;
    }
  }
  if (removed > 0)
    std::fprintf(stderr, "[tokenize] %s: removed %lld shard files of an unfinished run; starting again\n", dir.c_str(),
                 static_cast<long long>(removed));
}

struct Job {
  int64_t seq = 0;
  std::vector<TextPiece> pieces;
};
struct JobResult {
  std::vector<std::vector<int32_t>> ids;  // per piece, EOS appended at document ends
  std::vector<bool> ends;
};

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  for (const auto& p : patterns) {
    if (p.find_first_of("*?[") == std::string::npos) {
      check_regular_file(p);
      out.push_back(p);
      continue;
    }
    glob_t g{};
    const int rc = glob(p.c_str(), 0, nullptr, &g);
    if (rc != 0 || g.gl_pathc == 0) {
      globfree(&g);
      throw Error("--input: \"" + p + "\" matches no file");
    }
    for (size_t i = 0; i < g.gl_pathc; ++i) {
      check_regular_file(g.gl_pathv[i]);
      out.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
  }
  if (out.empty()) throw Error("--input: no files given");
  return out;
}

TokenizeProgress tokenize_to_dataset(const Tokenizer& tok, const TokenizeOptions& o) {
  if (o.inputs.empty()) throw Error("tokenize: no input files");
  if (o.shard_tokens < 1) throw Error("--shard-tokens must be at least 1, got " + std::to_string(o.shard_tokens));
  for (const auto& in : o.inputs) check_regular_file(in);
  const bool single = ends_with(o.output, ".u32");
  if (single) {
    const auto parent = fs::path(o.output).parent_path();
    if (!parent.empty()) fs::create_directories(parent);
  } else {
    prepare_folder(o.output);
  }
  const int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  const size_t chunk = tok.safe_to_split_at_newlines() ? o.chunk_bytes : 0;
  const size_t job_bytes = std::max<size_t>(o.chunk_bytes, 1 << 20);

  ShardWriter writer(o.output, single, o.shard_tokens);
  TokenizeProgress p;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double last_report = 0;
  nlohmann::json sources = nlohmann::json::array();

  std::mutex m;
  std::condition_variable cv;
  std::deque<Job> queue;
  std::map<int64_t, JobResult> done;
  bool closing = false;
  std::exception_ptr failure;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      while (true) {
        Job job;
        {
          std::unique_lock<std::mutex> lock(m);
          cv.wait(lock, [&] { return closing || !queue.empty(); });
          if (queue.empty()) return;
          job = std::move(queue.front());
          queue.pop_front();
        }
        JobResult r;
        try {
          for (auto& piece : job.pieces) {
            r.ids.push_back(tok.encode(piece.text, /*parse_special=*/false));
            if (piece.document_end && o.eos_id >= 0) r.ids.back().push_back(static_cast<int32_t>(o.eos_id));
            r.ends.push_back(piece.document_end);
          }
        } catch (...) {
          std::lock_guard<std::mutex> lock(m);
          if (!failure) failure = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(m);
        done[job.seq] = std::move(r);
        cv.notify_all();
      }
    });
  auto stop_pool = [&] {
    {
      std::lock_guard<std::mutex> lock(m);
      closing = true;
      queue.clear();
    }
    cv.notify_all();
    for (auto& t : pool) t.join();
  };

  int64_t next_seq = 0, written_seq = 0;
  auto write_ready = [&](bool wait_for_one) {
    std::unique_lock<std::mutex> lock(m);
    if (wait_for_one) cv.wait(lock, [&] { return failure || done.count(written_seq); });
    if (failure) std::rethrow_exception(failure);
    while (done.count(written_seq)) {
      JobResult r = std::move(done[written_seq]);
      done.erase(written_seq++);
      lock.unlock();
      for (size_t i = 0; i < r.ids.size(); ++i) {
        writer.write(r.ids[i], r.ends[i]);
        p.tokens += static_cast<int64_t>(r.ids[i].size());
        p.documents += r.ends[i];
      }
      lock.lock();
    }
  };

  try {
    for (const auto& path : o.inputs) {
      TextReader reader(path, o.field, chunk);
      int64_t file_docs = 0;
      Job job;
      size_t bytes = 0;
      TextPiece piece;
      auto submit = [&] {
        if (job.pieces.empty()) return;
        job.seq = next_seq++;
        {
          std::lock_guard<std::mutex> lock(m);
          queue.push_back(std::move(job));
        }
        cv.notify_all();
        job = Job{};
        bytes = 0;
        // At most two jobs per thread in flight: memory stays bounded whatever the input size.
        while (next_seq - written_seq >= 2 * threads) write_ready(true);
        write_ready(false);
      };
      int64_t file_bytes_before = p.bytes;
      while (reader.next(piece)) {
        bytes += piece.text.size();
        file_docs += piece.document_end;
        job.pieces.push_back(std::move(piece));
        piece = TextPiece{};
        if (bytes >= job_bytes) submit();
        p.bytes = file_bytes_before + reader.bytes_read();
        if (o.progress && elapsed() - last_report >= 1.0) {
          last_report = p.seconds = elapsed();
          o.progress(p);
        }
      }
      submit();
      p.bytes = file_bytes_before + reader.bytes_read();
      sources.push_back({{"path", path}, {"bytes", reader.bytes_read()}, {"documents", file_docs}});
    }
    while (written_seq < next_seq) write_ready(true);
  } catch (...) {
    stop_pool();
    throw;
  }
  stop_pool();
  const nlohmann::json shards = writer.finish();
  if (!single) {
    nlohmann::json index = {{"format", "linearize-tokens"},
                            {"version", 1},
                            {"tokens", p.tokens},
                            {"documents", p.documents},
                            {"eos", o.eos_id},
                            {"tokenizer",
                             {{"source", o.tokenizer_source},
                              {"vocab_size", tok.vocab_size()},
                              {"hash", tokenizer_fingerprint(tok, tok.vocab_size())}}},
                            {"shards", shards},
                            {"sources", sources}};
    write_file_atomic((fs::path(o.output) / "index.json").string(),
                      [&](std::ostream& out) { out << index.dump(1) << "\n"; });
  }
  p.seconds = elapsed();
  p.done = true;
  if (o.progress) o.progress(p);
  return p;
}

}  // namespace linearize
