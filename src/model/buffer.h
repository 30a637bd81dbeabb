// Buf<T>: activation and scratch storage. Resizing never initialises and
// never shrinks the allocation, so buffers reused across steps and layers of
// different shapes cost no memset and no page faults after the first step
// (std::vector value-initialises every element it grows by).
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>

namespace myriad {

template <typename T>
class Buf {
 public:
  Buf() = default;
  Buf(Buf&&) noexcept = default;
  Buf& operator=(Buf&&) noexcept = default;

  // Size n; contents are unspecified where the buffer grew (or was reused).
  void resize(size_t n) {
    if (n > cap_) {
      data_.reset(new T[n]);  // default-init: no zeroing
      cap_ = n;
    }
    size_ = n;
  }
  void assign(size_t n, T v) {
    resize(n);
    for (size_t i = 0; i < n; ++i) data_[i] = v;
  }
  void clear() { size_ = 0; }
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  T* begin() { return data_.get(); }
  T* end() { return data_.get() + size_; }
  const T* begin() const { return data_.get(); }
  const T* end() const { return data_.get() + size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  void swap(Buf& o) {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(cap_, o.cap_);
  }

 private:
  std::unique_ptr<T[]> data_;
  size_t size_ = 0, cap_ = 0;
};

// Sizes a buffer (Buf or std::vector) to n elements; a no-op when it
// already has that size, which is every step after the first.
template <typename V>
void Fit(V* v, size_t n) {
  if (v->size() != n) v->resize(n);
}

}  // namespace myriad
