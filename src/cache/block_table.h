// BlockTable: one sequence's list of blocks in one cache group, and its slot mapping.
//
//   positions   0 ..15 | 16..31 | 32..47 | 48..52        (block_size 16, num_tokens 53)
//   entries     [  7   |   2    |   9    |   4   ]      entry i holds positions [16i, 16i+16)
//   slot(p)   = entries[p / block_size] * block_size + p % block_size
//               slot(35) = 9 * 16 + 3 = 147
//
// Only the last block can be partially filled. Blocks are reference counted in the group's
// BlockAllocator: fork() shares every block, and an append that writes into a partially filled
// last block which is shared (ref_count > 1) or cached (immutable) first copies it
// (copy-on-write) and reports the BlockCopy for the backend to execute before any KV write.
//
// Sliding-window groups (window_tokens W > 0): a token at position p attends to (p - W, p].
// Before each append, blocks wholly behind the window of the next token are released and their
// entries become "dropped"; positions keep their meaning. After an append of one token a table
// holds at most ceil(W / block_size) + 1 blocks (an append of n tokens holds the window of its
// first token plus the n new ones).
//
// The destructor releases every held block, so the allocator must outlive its tables.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/block_allocator.h"
#include "cache/block_ops.h"
#include "common/ids.h"

namespace kvp {

class BlockTable {
 public:
  // requires: allocator != nullptr (not owned, outlives the table), block_size a power of two
  // in [1, 1024], window_tokens >= 0 (0: no window).
  BlockTable(BlockAllocator* allocator, int32_t block_size, int32_t window_tokens = 0);
  ~BlockTable() { free(); }
  BlockTable(BlockTable&& other) noexcept;
  BlockTable& operator=(BlockTable&& other) noexcept;
  BlockTable(const BlockTable&) = delete;
  BlockTable& operator=(const BlockTable&) = delete;

  int32_t num_tokens() const { return num_tokens_; }
  int32_t block_size() const { return block_size_; }
  int32_t window_tokens() const { return window_tokens_; }
  BlockAllocator* allocator() const { return allocator_; }
  // Entries, dropped ones included: ceil(num_tokens / block_size).
  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_dropped_blocks() const { return first_live_; }
  int32_t num_held_blocks() const { return num_blocks() - first_live_; }
  // Entries; those below num_dropped_blocks() are not held and must not be read.
  std::span<const BlockId> blocks() const { return blocks_; }
  // requires: num_dropped_blocks() <= index < num_blocks()
  BlockId block(int32_t index) const {
    KVP_DCHECK(index >= first_live_ && index < num_blocks(), "block index {} not held", index);
    return blocks_[index];
  }

  // Blocks append(num_tokens) would take from the allocator now (new blocks plus a copy of a
  // shared or cached partial tail), assuming the window trim it does first. Does not modify.
  int32_t blocks_needed(int32_t num_tokens) const;
  // Releases blocks wholly behind the window of the next token (no-op without a window).
  // Mutates.
  void trim_window();
  // Grows the sequence by num_tokens positions, allocating a block only when a block boundary is
  // crossed. Returns false and changes nothing but the window trim when the pool lacks blocks.
  // Copies needed before writing are appended to *copies (may be nullptr only when no copy can
  // be needed, i.e. the tail is writable). requires: num_tokens >= 0. Mutates.
  bool append(int32_t num_tokens, std::vector<BlockCopy>* copies) {
    KVP_DCHECK(num_tokens >= 0, "append of {} tokens", num_tokens);
    if (window_tokens_ != 0) trim_window();
    const int32_t used_in_tail = num_tokens_ & mask_;
    if (used_in_tail != 0 && used_in_tail + num_tokens <= block_size_ &&
        allocator_->is_writable(blocks_.back())) [[likely]] {
      num_tokens_ += num_tokens;
      return true;
    }
    return append_slow(num_tokens, copies);
  }

  // Physical slot of a position. requires: num_dropped_blocks()*block_size <= position <
  // num_tokens(). Does not modify.
  int64_t slot(int32_t position) const {
    KVP_DCHECK(position >= (first_live_ << shift_) && position < num_tokens_,
               "position {} outside held range [{}, {})", position, first_live_ << shift_,
               num_tokens_);
    return int64_t{blocks_[position >> shift_].value} * block_size_ + (position & mask_);
  }
  // out[i] = slot(first_position + i) for i in [0, num_positions).
  // out: [num_positions] caller-owned. Does not modify.
  void fill_slots(int32_t first_position, int32_t num_positions, int64_t* out) const;

  // Whether truncate(num_tokens) is allowed: not longer than now, and (with a window) the window
  // of the next token is still held.
  bool can_truncate(int32_t num_tokens) const;
  // Shortens the sequence to num_tokens, releasing blocks past it. The new last block may be
  // shared or cached: the next append copies it first. requires: can_truncate. Mutates.
  void truncate(int32_t num_tokens);

  // A new table sharing every held block (each ref_count + 1), same tokens and dropped entries.
  // Mutates the allocator's counts only.
  BlockTable fork() const;

  // Takes ownership of one reference to each of `blocks` (already retained by the caller) as
  // entries [num_dropped_blocks, num_dropped_blocks + blocks.size()).
  // requires: the table is empty, num_tokens fills exactly those entries
  // (ceil(num_tokens / block_size) == num_dropped_blocks + blocks.size()). Mutates.
  void adopt(int32_t num_dropped_blocks, std::span<const BlockId> blocks, int32_t num_tokens);
  // Releases every held block; the table becomes empty. Mutates.
  void free();

  // Aborts unless entries match num_tokens, every held block is held in the allocator
  // (ref_count >= 1) and appears once. Does not modify.
  void check_integrity() const;

 private:
  bool append_slow(int32_t num_tokens, std::vector<BlockCopy>* copies);
  int32_t first_needed_position() const;

  BlockAllocator* allocator_;
  int32_t block_size_;
  int32_t shift_;  // log2(block_size)
  int32_t mask_;   // block_size - 1
  int32_t window_tokens_;
  int32_t num_tokens_ = 0;
  int32_t first_live_ = 0;       // entries [0, first_live_) are dropped
  std::vector<BlockId> blocks_;  // [ceil(num_tokens / block_size)]
};

// Decode slot mapping of a batch: out[i] = slot of the last position of tables[i].
// tables: [batch] each with num_tokens() >= 1; out: [batch] caller-owned. Does not modify.
void fill_last_slots(std::span<const BlockTable* const> tables, int64_t* out);

}  // namespace kvp
