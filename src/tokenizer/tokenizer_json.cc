// tokenizer.json loading (see tokenizer_json.h). Every field is read defensively: a missing or
// mistyped field is a kCorruption Status naming the JSON path, never an exception or a crash.
#include "tokenizer/tokenizer_json.h"

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kvp {
namespace {

using nlohmann::json;

// Carries the file name so every error names it.
struct Ctx {
  std::string source;

  Status corrupt(std::string_view where, std::string_view why) const {
    return Status::corruption("tokenizer '{}': {}: {}", source, where, why);
  }
  Status unsupported(std::string_view where, std::string_view what) const {
    return Status::unsupported("tokenizer '{}': {}: {} is not supported", source, where, what);
  }
};

const json* find(const json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

bool is_null_or_missing(const json& obj, const char* key) {
  const json* v = find(obj, key);
  return v == nullptr || v->is_null();
}

Result<std::string> get_string(const Ctx& ctx, const json& obj, const char* key,
                               std::string_view where) {
  const json* v = find(obj, key);
  if (v == nullptr || !v->is_string()) {
    return ctx.corrupt(where, fmt::format("'{}' must be a string", key));
  }
  return v->get<std::string>();
}

Result<bool> get_bool(const Ctx& ctx, const json& obj, const char* key, bool fallback,
                      std::string_view where) {
  const json* v = find(obj, key);
  if (v == nullptr || v->is_null()) return fallback;
  if (!v->is_boolean()) return ctx.corrupt(where, fmt::format("'{}' must be a boolean", key));
  return v->get<bool>();
}

// HF patterns: {"String": "..."} or {"Regex": "..."}.
Status get_pattern(const Ctx& ctx, const json& obj, std::string_view where, std::string* pattern,
                   bool* is_regex) {
  const json* p = find(obj, "pattern");
  if (p == nullptr || !p->is_object()) return ctx.corrupt(where, "'pattern' must be an object");
  if (const json* s = find(*p, "String"); s != nullptr && s->is_string()) {
    *pattern = s->get<std::string>();
    *is_regex = false;
    return Status::ok();
  }
  if (const json* r = find(*p, "Regex"); r != nullptr && r->is_string()) {
    *pattern = r->get<std::string>();
    *is_regex = true;
    return Status::ok();
  }
  return ctx.corrupt(where, "'pattern' must hold \"String\" or \"Regex\"");
}

Status parse_normalizer(const Ctx& ctx, const json& node, std::vector<NormalizerStep>* out) {
  if (node.is_null()) return Status::ok();
  KVP_ASSIGN_OR_RETURN(std::string type, get_string(ctx, node, "type", "normalizer"));
  if (type == "Sequence") {
    const json* list = find(node, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return ctx.corrupt("normalizer", "Sequence needs a 'normalizers' array");
    }
    for (const json& child : *list) KVP_RETURN_IF_ERROR(parse_normalizer(ctx, child, out));
    return Status::ok();
  }
  if (type == "Replace") {
    NormalizerStep step;
    step.kind = NormalizerStep::Kind::kReplace;
    bool is_regex = false;
    KVP_RETURN_IF_ERROR(get_pattern(ctx, node, "normalizer Replace", &step.pattern, &is_regex));
    if (is_regex) return ctx.unsupported("normalizer Replace", "a Regex pattern");
    if (step.pattern.empty()) return ctx.corrupt("normalizer Replace", "empty pattern");
    KVP_ASSIGN_OR_RETURN(step.content, get_string(ctx, node, "content", "normalizer Replace"));
    out->push_back(std::move(step));
    return Status::ok();
  }
  if (type == "Prepend") {
    NormalizerStep step;
    step.kind = NormalizerStep::Kind::kPrepend;
    KVP_ASSIGN_OR_RETURN(step.content, get_string(ctx, node, "prepend", "normalizer Prepend"));
    out->push_back(std::move(step));
    return Status::ok();
  }
  return ctx.unsupported("normalizer", fmt::format("type '{}'", type));
}

Result<SplitBehavior> parse_behavior(const Ctx& ctx, const json& node) {
  KVP_ASSIGN_OR_RETURN(std::string b, get_string(ctx, node, "behavior", "pre_tokenizer Split"));
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return ctx.unsupported("pre_tokenizer Split", fmt::format("behavior '{}'", b));
}

Status parse_pre_tokenizer(const Ctx& ctx, const json& node, std::vector<PreTokenizerStep>* out) {
  if (node.is_null()) return Status::ok();
  KVP_ASSIGN_OR_RETURN(std::string type, get_string(ctx, node, "type", "pre_tokenizer"));
  PreTokenizerStep step;
  if (type == "Sequence") {
    const json* list = find(node, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return ctx.corrupt("pre_tokenizer", "Sequence needs a 'pretokenizers' array");
    }
    for (const json& child : *list) KVP_RETURN_IF_ERROR(parse_pre_tokenizer(ctx, child, out));
    return Status::ok();
  }
  if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    KVP_RETURN_IF_ERROR(
        get_pattern(ctx, node, "pre_tokenizer Split", &step.pattern, &step.pattern_is_regex));
    KVP_ASSIGN_OR_RETURN(step.behavior, parse_behavior(ctx, node));
    KVP_ASSIGN_OR_RETURN(bool invert, get_bool(ctx, node, "invert", false, "pre_tokenizer Split"));
    if (invert) return ctx.unsupported("pre_tokenizer Split", "invert: true");
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    KVP_ASSIGN_OR_RETURN(step.use_regex,
                         get_bool(ctx, node, "use_regex", true, "pre_tokenizer ByteLevel"));
    KVP_ASSIGN_OR_RETURN(step.add_prefix_space,
                         get_bool(ctx, node, "add_prefix_space", true, "pre_tokenizer ByteLevel"));
  } else if (type == "Digits") {
    step.kind = PreTokenizerStep::Kind::kDigits;
    KVP_ASSIGN_OR_RETURN(step.individual_digits,
                         get_bool(ctx, node, "individual_digits", false, "pre_tokenizer Digits"));
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    KVP_ASSIGN_OR_RETURN(step.replacement,
                         get_string(ctx, node, "replacement", "pre_tokenizer Metaspace"));
    KVP_ASSIGN_OR_RETURN(step.split, get_bool(ctx, node, "split", true, "pre_tokenizer Metaspace"));
    std::string scheme = "always";
    if (const json* s = find(node, "prepend_scheme"); s != nullptr && s->is_string()) {
      scheme = s->get<std::string>();
    } else if (const json* a = find(node, "add_prefix_space"); a != nullptr && a->is_boolean()) {
      scheme = a->get<bool>() ? "always" : "never";
    }
    if (scheme == "always") {
      step.prepend = PreTokenizerStep::Prepend::kAlways;
    } else if (scheme == "first") {
      step.prepend = PreTokenizerStep::Prepend::kFirst;
    } else if (scheme == "never") {
      step.prepend = PreTokenizerStep::Prepend::kNever;
    } else {
      return ctx.unsupported("pre_tokenizer Metaspace", fmt::format("prepend_scheme '{}'", scheme));
    }
  } else {
    return ctx.unsupported("pre_tokenizer", fmt::format("type '{}'", type));
  }
  out->push_back(std::move(step));
  return Status::ok();
}

Status parse_decoder(const Ctx& ctx, const json& node, std::vector<DecoderStep>* out) {
  if (node.is_null()) return Status::ok();
  KVP_ASSIGN_OR_RETURN(std::string type, get_string(ctx, node, "type", "decoder"));
  DecoderStep step;
  if (type == "Sequence") {
    const json* list = find(node, "decoders");
    if (list == nullptr || !list->is_array()) {
      return ctx.corrupt("decoder", "Sequence needs a 'decoders' array");
    }
    for (const json& child : *list) KVP_RETURN_IF_ERROR(parse_decoder(ctx, child, out));
    return Status::ok();
  }
  if (type == "ByteLevel") {
    step.kind = DecoderStep::Kind::kByteLevel;
  } else if (type == "Replace") {
    step.kind = DecoderStep::Kind::kReplace;
    bool is_regex = false;
    KVP_RETURN_IF_ERROR(get_pattern(ctx, node, "decoder Replace", &step.pattern, &is_regex));
    if (is_regex) return ctx.unsupported("decoder Replace", "a Regex pattern");
    if (step.pattern.empty()) return ctx.corrupt("decoder Replace", "empty pattern");
    KVP_ASSIGN_OR_RETURN(step.content, get_string(ctx, node, "content", "decoder Replace"));
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = DecoderStep::Kind::kStrip;
    KVP_ASSIGN_OR_RETURN(step.content, get_string(ctx, node, "content", "decoder Strip"));
    const json* start = find(node, "start");
    const json* stop = find(node, "stop");
    if (start == nullptr || !start->is_number_unsigned() || stop == nullptr ||
        !stop->is_number_unsigned()) {
      return ctx.corrupt("decoder Strip", "'start' and 'stop' must be non-negative integers");
    }
    step.strip_start = start->get<int>();
    step.strip_stop = stop->get<int>();
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::kMetaspace;
    KVP_ASSIGN_OR_RETURN(step.replacement,
                         get_string(ctx, node, "replacement", "decoder Metaspace"));
    std::string scheme = "always";
    if (const json* s = find(node, "prepend_scheme"); s != nullptr && s->is_string()) {
      scheme = s->get<std::string>();
    } else if (const json* a = find(node, "add_prefix_space"); a != nullptr && a->is_boolean()) {
      scheme = a->get<bool>() ? "always" : "never";
    }
    step.metaspace_strip_first = scheme != "never";
  } else {
    return ctx.unsupported("decoder", fmt::format("type '{}'", type));
  }
  out->push_back(std::move(step));
  return Status::ok();
}

// Finds the id TemplateProcessing gives a special token name.
Result<TokenId> template_special_id(const Ctx& ctx, const json& node, const std::string& name) {
  const json* specials = find(node, "special_tokens");
  const json* entry = specials != nullptr ? find(*specials, name.c_str()) : nullptr;
  const json* ids = entry != nullptr ? find(*entry, "ids") : nullptr;
  if (ids == nullptr || !ids->is_array() || ids->size() != 1 || !(*ids)[0].is_number_integer()) {
    return ctx.unsupported("post_processor TemplateProcessing",
                           fmt::format("special token '{}' without exactly one id", name));
  }
  // a wider integer would wrap into some other, valid id
  const json& id = (*ids)[0];
  if (!id.is_number_unsigned() || id.get<uint64_t>() > uint64_t{INT32_MAX}) {
    return ctx.corrupt("post_processor TemplateProcessing",
                       fmt::format("special token '{}' has id {}", name, id.dump()));
  }
  return id.get<TokenId>();
}

Status parse_post_processor(const Ctx& ctx, const json& node, TokenizerVocab* vocab) {
  if (node.is_null()) return Status::ok();
  KVP_ASSIGN_OR_RETURN(std::string type, get_string(ctx, node, "type", "post_processor"));
  if (type == "ByteLevel") return Status::ok();  // only moves offsets
  if (type == "Sequence") {
    const json* list = find(node, "processors");
    if (list == nullptr || !list->is_array()) {
      return ctx.corrupt("post_processor", "Sequence needs a 'processors' array");
    }
    for (const json& child : *list) KVP_RETURN_IF_ERROR(parse_post_processor(ctx, child, vocab));
    return Status::ok();
  }
  if (type != "TemplateProcessing") {
    return ctx.unsupported("post_processor", fmt::format("type '{}'", type));
  }
  const json* single = find(node, "single");
  if (single == nullptr || !single->is_array()) {
    return ctx.corrupt("post_processor TemplateProcessing", "'single' must be an array");
  }
  bool seen_sequence = false;
  for (const json& item : *single) {
    if (find(item, "Sequence") != nullptr) {
      if (seen_sequence) {
        return ctx.unsupported("post_processor TemplateProcessing", "two sequences in 'single'");
      }
      seen_sequence = true;
      continue;
    }
    const json* special = find(item, "SpecialToken");
    if (special == nullptr) return ctx.corrupt("post_processor TemplateProcessing", "bad item");
    KVP_ASSIGN_OR_RETURN(std::string name,
                         get_string(ctx, *special, "id", "post_processor TemplateProcessing"));
    KVP_ASSIGN_OR_RETURN(TokenId id, template_special_id(ctx, node, name));
    bool& flag = seen_sequence ? vocab->add_eos : vocab->add_bos;
    std::optional<TokenId>& slot = seen_sequence ? vocab->eos_id : vocab->bos_id;
    if (flag) {
      return ctx.unsupported("post_processor TemplateProcessing",
                             "more than one special token on one side of $A");
    }
    flag = true;
    slot = id;
  }
  if (!seen_sequence) {
    return ctx.corrupt("post_processor TemplateProcessing", "'single' has no $A sequence");
  }
  return Status::ok();
}

Status parse_model(const Ctx& ctx, const json& node, TokenizerJson* out) {
  if (!node.is_object()) return ctx.corrupt("model", "must be an object");
  const json* type = find(node, "type");
  // Old files omit the type of a BPE model.
  if (type != nullptr && !(type->is_string() && type->get<std::string>() == "BPE")) {
    return ctx.unsupported("model", fmt::format("type {}", type->dump()));
  }
  if (!is_null_or_missing(node, "dropout")) {
    const json* d = find(node, "dropout");
    if (!(d->is_number() && d->get<double>() == 0.0)) {
      return ctx.unsupported("model BPE", "dropout");
    }
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = find(node, affix);
    if (v != nullptr && !v->is_null() && !(v->is_string() && v->get<std::string>().empty())) {
      return ctx.unsupported("model BPE", affix);
    }
  }
  TokenizerPipeline& pipeline = out->pipeline;
  KVP_ASSIGN_OR_RETURN(pipeline.byte_fallback,
                       get_bool(ctx, node, "byte_fallback", false, "model BPE"));
  KVP_ASSIGN_OR_RETURN(pipeline.fuse_unk, get_bool(ctx, node, "fuse_unk", false, "model BPE"));
  KVP_ASSIGN_OR_RETURN(pipeline.ignore_merges,
                       get_bool(ctx, node, "ignore_merges", false, "model BPE"));

  const json* vocab = find(node, "vocab");
  if (vocab == nullptr || !vocab->is_object()) {
    return ctx.corrupt("model.vocab", "must be an object of token -> id");
  }
  std::vector<std::string>& tokens = out->vocab.tokens;
  std::vector<bool> filled;
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it.value().is_number_unsigned()) {
      return ctx.corrupt("model.vocab",
                         fmt::format("id of '{}' is not a non-negative integer", it.key()));
    }
    const uint64_t id = it.value().get<uint64_t>();
    if (id >= (1u << 24)) {
      return ctx.corrupt("model.vocab", fmt::format("id {} of '{}' is too large", id, it.key()));
    }
    if (id >= tokens.size()) {
      tokens.resize(id + 1);
      filled.resize(id + 1, false);
    }
    if (filled[id]) return ctx.corrupt("model.vocab", fmt::format("id {} used twice", id));
    filled[id] = true;
    tokens[id] = it.key();
  }

  const json* merges = find(node, "merges");
  if (merges == nullptr || !merges->is_array()) {
    return ctx.corrupt("model.merges", "must be an array");
  }
  out->vocab.merges.reserve(merges->size());
  for (const json& m : *merges) {
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos) {
        return ctx.corrupt("model.merges", fmt::format("merge '{}' has no space", s));
      }
      out->vocab.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      out->vocab.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return ctx.corrupt("model.merges", fmt::format("bad merge {}", m.dump()));
    }
  }

  if (!is_null_or_missing(node, "unk_token")) {
    KVP_ASSIGN_OR_RETURN(std::string unk, get_string(ctx, node, "unk_token", "model BPE"));
    const json* id = find(*vocab, unk.c_str());
    if (id == nullptr) {
      return ctx.corrupt("model.unk_token", fmt::format("'{}' is not in the vocab", unk));
    }
    out->vocab.unk_id = id->get<TokenId>();
  }
  return Status::ok();
}

Status parse_added_tokens(const Ctx& ctx, const json& node, TokenizerJson* out) {
  if (node.is_null()) return Status::ok();
  if (!node.is_array()) return ctx.corrupt("added_tokens", "must be an array");
  for (const json& item : node) {
    AddedToken added;
    const json* id = find(item, "id");
    if (id == nullptr || !id->is_number_unsigned() || id->get<uint64_t>() >= (1u << 24)) {
      return ctx.corrupt("added_tokens", "an entry without a valid 'id'");
    }
    added.id = id->get<TokenId>();
    KVP_ASSIGN_OR_RETURN(added.content, get_string(ctx, item, "content", "added_tokens"));
    if (added.content.empty()) return ctx.corrupt("added_tokens", "empty 'content'");
    KVP_ASSIGN_OR_RETURN(added.special, get_bool(ctx, item, "special", false, "added_tokens"));
    KVP_ASSIGN_OR_RETURN(added.normalized,
                         get_bool(ctx, item, "normalized", !added.special, "added_tokens"));
    KVP_ASSIGN_OR_RETURN(added.lstrip, get_bool(ctx, item, "lstrip", false, "added_tokens"));
    KVP_ASSIGN_OR_RETURN(added.rstrip, get_bool(ctx, item, "rstrip", false, "added_tokens"));
    KVP_ASSIGN_OR_RETURN(bool single_word,
                         get_bool(ctx, item, "single_word", false, "added_tokens"));
    if (single_word) {
      return ctx.unsupported("added_tokens", fmt::format("single_word on '{}'", added.content));
    }
    // An added token may extend the vocabulary past the model's ids.
    std::vector<std::string>& tokens = out->vocab.tokens;
    const auto index = static_cast<size_t>(added.id);
    if (index >= tokens.size()) tokens.resize(index + 1);
    if (tokens[index].empty()) {
      tokens[index] = added.content;
    } else if (tokens[index] != added.content) {
      return ctx.corrupt("added_tokens", fmt::format("id {} is '{}' in the vocab but '{}' here",
                                                     added.id, tokens[index], added.content));
    }
    out->pipeline.added_tokens.push_back(std::move(added));
  }
  return Status::ok();
}

bool is_byte_token(std::string_view t) {
  auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
  return t.size() == 6 && t.substr(0, 3) == "<0x" && hex(t[3]) && hex(t[4]) && t[5] == '>';
}

}  // namespace

Result<TokenizerJson> parse_tokenizer_json(std::string_view json_text, std::string_view source) {
  const Ctx ctx{std::string(source)};
  json root = json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return ctx.corrupt("file", "not valid JSON");
  if (!root.is_object()) return ctx.corrupt("file", "top level is not an object");
  const json* model = find(root, "model");
  if (model == nullptr) return ctx.corrupt("file", "no 'model'");

  TokenizerJson out;
  KVP_RETURN_IF_ERROR(parse_model(ctx, *model, &out));
  static const json kNull;
  auto field = [&](const char* key) -> const json& {
    const json* v = find(root, key);
    return v != nullptr ? *v : kNull;
  };
  KVP_RETURN_IF_ERROR(parse_added_tokens(ctx, field("added_tokens"), &out));
  KVP_RETURN_IF_ERROR(parse_normalizer(ctx, field("normalizer"), &out.pipeline.normalizer));
  KVP_RETURN_IF_ERROR(
      parse_pre_tokenizer(ctx, field("pre_tokenizer"), &out.pipeline.pre_tokenizer));
  KVP_RETURN_IF_ERROR(parse_decoder(ctx, field("decoder"), &out.pipeline.decoder));
  KVP_RETURN_IF_ERROR(parse_post_processor(ctx, field("post_processor"), &out.vocab));

  // Model kind and token types, as a GGUF file would state them.
  bool spm = out.pipeline.byte_fallback;
  for (const NormalizerStep& step : out.pipeline.normalizer) {
    spm = spm || step.content == "\xE2\x96\x81";
  }
  for (const PreTokenizerStep& step : out.pipeline.pre_tokenizer) {
    spm = spm || step.kind == PreTokenizerStep::Kind::kMetaspace;
  }
  out.vocab.model = spm ? TokenizerModel::kSentencePieceBpe : TokenizerModel::kByteLevelBpe;
  out.vocab.token_types.assign(out.vocab.tokens.size(), TokenType::kNormal);
  for (size_t i = 0; i < out.vocab.tokens.size(); ++i) {
    if (out.vocab.tokens[i].empty()) {
      out.vocab.token_types[i] = TokenType::kUnused;
    } else if (out.pipeline.byte_fallback && is_byte_token(out.vocab.tokens[i])) {
      out.vocab.token_types[i] = TokenType::kByte;
    }
  }
  for (const AddedToken& added : out.pipeline.added_tokens) {
    out.vocab.token_types[added.id] = added.special ? TokenType::kControl : TokenType::kUserDefined;
  }
  if (out.vocab.unk_id) out.vocab.token_types[*out.vocab.unk_id] = TokenType::kUnknown;
  return out;
}

Result<TokenizerJson> load_tokenizer_json(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return Status::not_found("tokenizer '{}': cannot open the file", path);
  std::ostringstream buffer;
  buffer << file.rdbuf();
  if (file.bad()) return Status::io_error("tokenizer '{}': read failed", path);
  return parse_tokenizer_json(buffer.str(), path);
}

}  // namespace kvp
