// Buf<T>: activation and scratch storage in device memory, allocated
// through the active backend's mem_alloc (ops::Active(); the backend that
// allocated a block frees it). Resizing never initialises and never shrinks
// the allocation, so buffers reused across steps and layers of different
// shapes cost no memset and no page faults after the first step
// (std::vector value-initialises every element it grows by).
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "ops/ops.h"

namespace myriad {

template <typename T>
class Buf {
  static_assert(std::is_trivially_copyable_v<T>, "Buf holds plain device data");

 public:
  Buf() = default;
  Buf(Buf&& o) noexcept { swap(o); }
  Buf& operator=(Buf&& o) noexcept {
    Buf tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() { release(); }

  // Size n; contents are unspecified where the buffer grew (or was reused).
  void resize(size_t n) {
    if (n > cap_) {
      release();
      backend_ = ops::Active();
      data_ = static_cast<T*>(backend_->ops().mem_alloc(n * sizeof(T)));
      cap_ = n;
    }
    size_ = n;
  }
  // Size n, every byte zero (through the backend: no host loop).
  void zero(size_t n) {
    resize(n);
    if (n) backend_->ops().mem_set(data_, 0, n * sizeof(T));
  }
  void clear() { size_ = 0; }
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  size_t capacity() const { return cap_; }  // elements allocated (what the buffer holds in memory)
  T* data() { return data_; }
  const T* data() const { return data_; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  void swap(Buf& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(cap_, o.cap_);
    std::swap(backend_, o.backend_);
  }

 private:
  void release() {
    if (data_) backend_->ops().mem_free(data_);
    data_ = nullptr;
    cap_ = size_ = 0;
  }
  T* data_ = nullptr;
  size_t size_ = 0, cap_ = 0;
  Backend* backend_ = nullptr;  // the backend whose mem_alloc made data_
};

// The explicit copies of whole buffers: a host copy of b's elements, and b
// set to a host vector's elements (resized to its size).
template <typename T>
void ToHost(const Buf<T>& b, std::vector<T>* h) {  // into *h, resized (its pages reused)
  h->resize(b.size());
  ops::CopyToHost(h->data(), b.data(), h->size() * sizeof(T));
}
template <typename T>
std::vector<T> ToHost(const Buf<T>& b) {
  std::vector<T> h;
  ToHost(b, &h);
  return h;
}
template <typename T>
void FromHost(Buf<T>* b, const std::vector<T>& host) {
  b->resize(host.size());
  ops::CopyToDevice(b->data(), host.data(), host.size() * sizeof(T));
}

// Sizes a buffer (Buf or std::vector) to n elements; a no-op when it
// already has that size, which is every step after the first.
template <typename V>
void Fit(V* v, size_t n) {
  if (v->size() != n) v->resize(n);
}

}  // namespace myriad
