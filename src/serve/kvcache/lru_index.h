// LruIndex: the recency order of a set of keys, least recently used first
// out. One implementation for every KV level that evicts by recency: the
// device pool (cached block ids, serve/kv_pool.h), the host tier and the disk
// tier (block keys). Redis evicts by its own server-side policy and does not
// use it.
//
// It holds keys only; the owner keeps what a key stands for (block data, a
// file size) in its own map and removes a key here when it removes it there.
// Every operation is O(1) on average. Not thread-safe: the owner's lock (or
// thread) guards it.
#pragma once

#include <cstddef>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace myriad::serve {

template <typename Key>
class LruIndex {
 public:
  // Makes `key` the most recently used one, entering it if absent.
  void Touch(const Key& key) {
    auto it = pos_.find(key);
    if (it != pos_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    order_.push_front(key);
    pos_.emplace(key, order_.begin());
  }
  // Removes `key`; false when it was not there.
  bool Erase(const Key& key) {
    auto it = pos_.find(key);
    if (it == pos_.end()) return false;
    order_.erase(it->second);
    pos_.erase(it);
    return true;
  }
  bool Contains(const Key& key) const { return pos_.count(key) != 0; }
  // The least recently used key (the next victim), or nullopt when empty.
  std::optional<Key> Oldest() const {
    if (order_.empty()) return std::nullopt;
    return order_.back();
  }
  // Removes and returns the least recently used key; nullopt when empty.
  std::optional<Key> PopOldest() {
    if (order_.empty()) return std::nullopt;
    Key k = order_.back();
    order_.pop_back();
    pos_.erase(k);
    return k;
  }
  // Every key, most recently used first (a snapshot).
  std::vector<Key> MostRecentFirst() const { return std::vector<Key>(order_.begin(), order_.end()); }
  size_t size() const { return order_.size(); }
  bool empty() const { return order_.empty(); }
  void Clear() {
    order_.clear();
    pos_.clear();
  }

 private:
  std::list<Key> order_;  // front = most recently used
  std::unordered_map<Key, typename std::list<Key>::iterator> pos_;
};

}  // namespace myriad::serve
