#include "train/checkpoint/async_writer.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <utility>

#include "core/log.h"

namespace myriad {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The persist thread's nice value: background work must not take cores from
// the training threads (as the serving engine's write-back worker).
constexpr int kPersistNice = 10;

}  // namespace

TensorView CheckpointSnapshot::Copy(const TensorView& view) {
  // Not value-initialised: the copy below is the only pass over the memory.
  std::unique_ptr<uint64_t[]> buf(new uint64_t[(view.nbytes + 7) / 8]);
  if (view.nbytes > 0 && view.data != nullptr) std::memcpy(buf.get(), view.data, view.nbytes);
  TensorView copy = view;
  // A null source stays null so that SaveCheckpoint reports the bad view.
  copy.data = view.data == nullptr ? nullptr : buf.get();
  buffers_.push_back(std::move(buf));
  bytes_ += static_cast<int64_t>(view.nbytes);
  return copy;
}

void CheckpointSnapshot::AddModel(const TensorView& view) { model_.push_back(Copy(view)); }

std::vector<float> SnapshotBufferPool::Take(size_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The smallest that fits, so that staging and whole-model buffers of
    // different sizes each find their own.
    size_t best = free_.size();
    for (size_t i = 0; i < free_.size(); ++i)
      if (free_[i].capacity() >= n && (best == free_.size() || free_[i].capacity() < free_[best].capacity()))
        best = i;
    if (best < free_.size()) {
      std::vector<float> v = std::move(free_[best]);
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
      v.resize(n);  // within capacity: no allocation; new elements (if any) zeroed
      return v;
    }
  }
  return std::vector<float>(n);
}

void SnapshotBufferPool::Give(std::vector<float>&& v) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(std::move(v));
}

CheckpointSnapshot::~CheckpointSnapshot() {
  if (!pool_) return;
  for (std::vector<float>& v : adopted_) pool_->Give(std::move(v));
}

const float* CheckpointSnapshot::Adopt(std::vector<float>&& data) {
  bytes_ += static_cast<int64_t>(data.size() * sizeof(float));
  adopted_.push_back(std::move(data));
  return adopted_.back().data();
}

void CheckpointSnapshot::AddModelView(const std::string& name, const std::vector<int64_t>& shape,
                                      const float* adopted, int64_t numel) {
  model_.push_back(TensorView{name, "F32", shape, adopted, static_cast<size_t>(numel < 0 ? 0 : numel) * sizeof(float)});
}

void CheckpointSnapshot::AddOptimizerView(const std::string& name, const std::vector<int64_t>& shape,
                                          const float* adopted, int64_t numel) {
  optimizer_.push_back(
      TensorView{name, "F32", shape, adopted, static_cast<size_t>(numel < 0 ? 0 : numel) * sizeof(float)});
}

void CheckpointSnapshot::AddOptimizer(const TensorView& view) {
  optimizer_.push_back(Copy(view));
}

void CheckpointSnapshot::AddModel(const std::string& name, const std::vector<int64_t>& shape,
                                  const float* src, int64_t numel) {
  AddModel(TensorView{name, "F32", shape, src,
                      static_cast<size_t>(numel < 0 ? 0 : numel) * sizeof(float)});
}

void CheckpointSnapshot::AddOptimizer(const std::string& name, const std::vector<int64_t>& shape,
                                      const float* src, int64_t numel) {
  AddOptimizer(TensorView{name, "F32", shape, src,
                          static_cast<size_t>(numel < 0 ? 0 : numel) * sizeof(float)});
}

std::unique_ptr<CheckpointSnapshot> CheckpointSnapshot::CopyOf(int64_t step,
                                                               const CheckpointData& data) {
  auto s = std::make_unique<CheckpointSnapshot>();
  s->step = step;
  s->meta = data.meta;
  s->buffers_.reserve(data.model.size() + data.optimizer.size());
  for (const TensorView& v : data.model) s->AddModel(v);
  for (const TensorView& v : data.optimizer) s->AddOptimizer(v);
  return s;
}

CheckpointData CheckpointSnapshot::View() const {
  CheckpointData data;
  data.meta = meta;
  data.model = model_;
  data.optimizer = optimizer_;
  return data;
}

AsyncCheckpointWriter::AsyncCheckpointWriter(Env* env, std::string root, int keep_last)
    : env_(env ? env : Env::Default()), root_(std::move(root)), keep_last_(keep_last) {
  thread_ = std::thread([this] {
    // Best effort: without the permission to lower it the thread just runs
    // at normal priority.
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kPersistNice);
    Loop();
  });
}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  Status last = Wait();
  if (!last.ok()) LOG_ERROR("checkpoint: %s", last.message().c_str());
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void AsyncCheckpointWriter::SetMirror(Env* env, std::string root, int keep_last) {
  std::lock_guard<std::mutex> lock(mu_);
  mirror_env_ = env ? env : Env::Default();
  mirror_root_ = std::move(root);
  mirror_keep_ = keep_last;
}

void AsyncCheckpointWriter::WaitMirror() {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  if (!mirror_pending_) return;
  cv_.wait(lock, [&] { return !mirror_pending_; });
  records_[job_record_].mirror_wait_s += SecondsSince(t0);
}

std::string AsyncCheckpointWriter::mirror() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mirror_root_;
}

Status AsyncCheckpointWriter::Submit(std::unique_ptr<CheckpointSnapshot> s, double snapshot_s) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!s) return Status::Error(root_ + ": AsyncCheckpointWriter::Submit got no snapshot (a bug in the caller)");
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  Status earlier = std::exchange(unreported_, Status::Ok());
  SaveRecord rec;
  rec.step = s->step;
  rec.snapshot_s = snapshot_s;
  job_ = std::move(s);
  job_record_ = records_.size();
  busy_ = true;
  mirror_pending_ = !mirror_root_.empty();
  rec.blocked_s = SecondsSince(t0);
  records_.push_back(std::move(rec));
  lock.unlock();
  cv_.notify_all();
  return earlier;
}

Status AsyncCheckpointWriter::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !busy_; });
  return std::exchange(unreported_, Status::Ok());
}

std::vector<SaveRecord> AsyncCheckpointWriter::records() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

bool AsyncCheckpointWriter::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return busy_;
}

void AsyncCheckpointWriter::Loop() {
  while (true) {
    std::unique_ptr<CheckpointSnapshot> job;
    size_t index = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || job_ != nullptr; });
      if (!job_) return;  // stopping, nothing handed over
      job = std::move(job_);
      index = job_record_;
    }
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t step = job->step;
    std::string mirror;
    Env* mirror_env = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      mirror = mirror_root_;
      mirror_env = mirror_env_;
    }
    if (!mirror.empty()) {
      Result<std::string> m = Status::Error("not saved");
      try {
        m = SaveCheckpoint(mirror_env, mirror, step, job->View(), mirror_keep_);
      } catch (const std::exception& e) {
        m = Status::Error(mirror + ": " + e.what());
      }
      if (!m.ok()) {
        LOG_WARN("shared-memory checkpoint copy off: %s", m.status().message().c_str());
        (void)mirror_env->RemoveAll(mirror);
        std::lock_guard<std::mutex> lock(mu_);
        mirror_root_.clear();
      }
    }
    const double mirror_s = SecondsSince(t0);
    {
      std::lock_guard<std::mutex> lock(mu_);
      mirror_pending_ = false;
    }
    cv_.notify_all();
    Result<std::string> saved = Status::Error("not saved");
    // Errors never escape the thread: an exception (out of memory, a meta
    // value JSON cannot serialise) becomes this persist's error.
    try {
      saved = SaveCheckpoint(env_, root_, step, job->View(), keep_last_);
    } catch (const std::exception& e) {
      saved = Status::Error(root_ + ": saving step " + std::to_string(step) + " failed: " +
                            e.what() + " (hint: the previous checkpoint and 'latest' are untouched)");
    } catch (...) {
      saved = Status::Error(root_ + ": saving step " + std::to_string(step) +
                            " failed with an unknown exception (hint: the previous checkpoint "
                            "and 'latest' are untouched)");
    }
    const double persist_s = SecondsSince(t0);
    const int64_t bytes = job->bytes();
    job.reset();  // free the snapshot before the next one can be handed over
    if (saved.ok()) {
      LOG_INFO("checkpoint %s (%.2fs in the background, %.1f MB)", saved->c_str(), persist_s,
               static_cast<double>(bytes) / 1e6);
    } else {
      LOG_WARN("checkpoint: background save of step %lld failed: %s", static_cast<long long>(step),
               saved.status().message().c_str());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      SaveRecord& rec = records_[index];
      rec.persist_s = persist_s;
      rec.mirror_s = mirror_s;
      rec.done = true;
      rec.ok = saved.ok();
      if (saved.ok()) {
        rec.dir = *saved;
      } else {
        rec.error = saved.status().message();
        // No earlier error can be pending: the Submit that started this
        // persist collected it.
        unreported_ = saved.status();
      }
      busy_ = false;
    }
    cv_.notify_all();
  }
}

}  // namespace myriad
