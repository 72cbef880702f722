// BlockTable: growth across block boundaries, copy-on-write, window trim, truncate, fork.
#include "cache/block_table.h"

#include <algorithm>
#include <bit>
#include <unordered_set>
#include <utility>

namespace kvp {

BlockTable::BlockTable(BlockAllocator* allocator, int32_t block_size, int32_t window_tokens)
    : allocator_(allocator), block_size_(block_size), window_tokens_(window_tokens) {
  KVP_CHECK(allocator != nullptr, "BlockTable needs an allocator");
  KVP_CHECK(block_size >= 1 && block_size <= 1024 &&
                std::has_single_bit(static_cast<uint32_t>(block_size)),
            "block_size {} is not a power of two in [1, 1024]", block_size);
  KVP_CHECK(window_tokens >= 0, "window_tokens {} is negative", window_tokens);
  shift_ = std::countr_zero(static_cast<uint32_t>(block_size));
  mask_ = block_size - 1;
}

BlockTable::BlockTable(BlockTable&& other) noexcept
    : allocator_(other.allocator_),
      block_size_(other.block_size_),
      shift_(other.shift_),
      mask_(other.mask_),
      window_tokens_(other.window_tokens_),
      num_tokens_(std::exchange(other.num_tokens_, 0)),
      first_live_(std::exchange(other.first_live_, 0)),
      blocks_(std::move(other.blocks_)) {
  other.blocks_.clear();
}

BlockTable& BlockTable::operator=(BlockTable&& other) noexcept {
  if (this != &other) {
    free();
    allocator_ = other.allocator_;
    block_size_ = other.block_size_;
    shift_ = other.shift_;
    mask_ = other.mask_;
    window_tokens_ = other.window_tokens_;
    num_tokens_ = std::exchange(other.num_tokens_, 0);
    first_live_ = std::exchange(other.first_live_, 0);
    blocks_ = std::move(other.blocks_);
    other.blocks_.clear();
  }
  return *this;
}

int32_t BlockTable::first_needed_position() const {
  if (window_tokens_ == 0) return 0;
  return std::max(0, num_tokens_ - window_tokens_ + 1);
}

void BlockTable::trim_window() {
  if (window_tokens_ == 0) return;
  const int32_t drop_until = std::min(first_needed_position() >> shift_, num_blocks());
  for (; first_live_ < drop_until; ++first_live_) {
    allocator_->release(blocks_[first_live_]);
    blocks_[first_live_] = BlockId{-1};
  }
}

int32_t BlockTable::blocks_needed(int32_t num_tokens) const {
  KVP_CHECK(num_tokens >= 0, "append of {} tokens", num_tokens);
  if (num_tokens == 0) return 0;
  const int32_t total = (num_tokens_ + num_tokens + mask_) >> shift_;
  int32_t needed = total - num_blocks();
  if ((num_tokens_ & mask_) != 0 && !allocator_->is_writable(blocks_.back())) ++needed;
  return needed;
}

bool BlockTable::append_slow(int32_t num_tokens, std::vector<BlockCopy>* copies) {
  const int32_t needed = blocks_needed(num_tokens);
  if (num_tokens == 0) return true;
  if (!allocator_->can_allocate(needed)) return false;
  std::optional<BlockId> shared_tail;
  if ((num_tokens_ & mask_) != 0 && !allocator_->is_writable(blocks_.back())) {
    KVP_CHECK(copies != nullptr, "append into a shared tail needs a copy list");
    BlockId dst = *allocator_->alloc();
    copies->push_back(BlockCopy{blocks_.back(), dst});
    shared_tail = blocks_.back();
    blocks_.back() = dst;
  }
  const int32_t total = (num_tokens_ + num_tokens + mask_) >> shift_;
  while (num_blocks() < total) blocks_.push_back(*allocator_->alloc());
  // Released last, so the copy source cannot be handed out again by this append.
  if (shared_tail) allocator_->release(*shared_tail);
  num_tokens_ += num_tokens;
  return true;
}

void BlockTable::fill_slots(int32_t first_position, int32_t num_positions, int64_t* out) const {
  KVP_DCHECK(num_positions >= 0 && first_position >= (first_live_ << shift_) &&
                 first_position + num_positions <= num_tokens_,
             "slots [{}, {}) outside held range", first_position, first_position + num_positions);
  int32_t position = first_position;
  const int32_t end = first_position + num_positions;
  while (position < end) {
    const int32_t index = position >> shift_;
    const int32_t block_end = std::min(end, (index + 1) << shift_);
    const int64_t base = int64_t{blocks_[index].value} * block_size_ - (index << shift_);
    for (; position < block_end; ++position) *out++ = base + position;
  }
}

bool BlockTable::can_truncate(int32_t num_tokens) const {
  if (num_tokens < 0 || num_tokens > num_tokens_) return false;
  if (first_live_ == 0) return true;
  return std::max(0, num_tokens - window_tokens_ + 1) >= (first_live_ << shift_);
}

void BlockTable::truncate(int32_t num_tokens) {
  KVP_CHECK(can_truncate(num_tokens), "truncate to {} tokens of a table with {} ({} dropped)",
            num_tokens, num_tokens_, first_live_);
  const int32_t keep = (num_tokens + mask_) >> shift_;
  while (num_blocks() > keep) {
    allocator_->release(blocks_.back());
    blocks_.pop_back();
  }
  num_tokens_ = num_tokens;
}

BlockTable BlockTable::fork() const {
  BlockTable child(allocator_, block_size_, window_tokens_);
  child.blocks_ = blocks_;
  child.first_live_ = first_live_;
  child.num_tokens_ = num_tokens_;
  for (int32_t i = first_live_; i < num_blocks(); ++i) allocator_->retain(blocks_[i]);
  return child;
}

void BlockTable::adopt(int32_t num_dropped_blocks, std::span<const BlockId> blocks,
                       int32_t num_tokens) {
  KVP_CHECK(num_tokens_ == 0 && blocks_.empty(), "adopt into a table that is not empty");
  const int32_t total = num_dropped_blocks + static_cast<int32_t>(blocks.size());
  KVP_CHECK(num_dropped_blocks >= 0 && num_tokens >= 0 && ((num_tokens + mask_) >> shift_) == total,
            "adopt of {} dropped + {} blocks for {} tokens (block_size {})", num_dropped_blocks,
            blocks.size(), num_tokens, block_size_);
  blocks_.assign(num_dropped_blocks, BlockId{-1});
  blocks_.insert(blocks_.end(), blocks.begin(), blocks.end());
  first_live_ = num_dropped_blocks;
  num_tokens_ = num_tokens;
}

void BlockTable::free() {
  for (int32_t i = first_live_; i < num_blocks(); ++i) allocator_->release(blocks_[i]);
  blocks_.clear();
  first_live_ = 0;
  num_tokens_ = 0;
}

void BlockTable::check_integrity() const {
  KVP_CHECK(num_blocks() == ((num_tokens_ + mask_) >> shift_), "{} entries for {} tokens",
            num_blocks(), num_tokens_);
  KVP_CHECK(first_live_ >= 0 && first_live_ <= num_blocks(), "first live entry {} of {}",
            first_live_, num_blocks());
  KVP_CHECK(window_tokens_ > 0 || first_live_ == 0, "dropped entries without a window");
  KVP_CHECK((first_live_ << shift_) <= first_needed_position() || first_live_ == 0,
            "dropped entry {} is still inside the window", first_live_ - 1);
  std::unordered_set<int32_t> seen;
  for (int32_t i = first_live_; i < num_blocks(); ++i) {
    const BlockId b = blocks_[i];
    KVP_CHECK(!allocator_->is_free(b) && allocator_->ref_count(b) >= 1,
              "entry {} references block {} that is not held", i, b.value);
    KVP_CHECK(seen.insert(b.value).second, "block {} appears twice in one table", b.value);
  }
}

void fill_last_slots(std::span<const BlockTable* const> tables, int64_t* out) {
  for (const BlockTable* table : tables) *out++ = table->slot(table->num_tokens() - 1);
}

}  // namespace kvp
