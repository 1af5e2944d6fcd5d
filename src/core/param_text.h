// core/param_text.h — parameters given as text by name: the one vocabulary of the CLI's flags (less
// their dashes), the C ABI's keys and the C++ fields. The value rules are the CLI's: integers as
// from_chars (a leading '+' allowed), finite numbers as strtod, booleans true/false, 1/0, yes/no,
// on/off, lists comma-separated. Errors name `arg`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "posenc/attention.h"
#include "posenc/rope.h"

namespace posenc::text {

Expected<std::int64_t> parse_int(const std::string& arg, const std::string& text);
Expected<double> parse_float(const std::string& arg, const std::string& text);  // finite
Expected<bool> parse_bool(const std::string& arg, const std::string& text);
Expected<std::vector<double>> parse_floats(const std::string& arg, const std::string& text);     // "1,2.5"
Expected<std::vector<std::int64_t>> parse_ints(const std::string& arg, const std::string& text);  // "16,24"

// A key as the vocabulary spells it: '-' read as '_' ("rotary-dim" → "rotary_dim").
std::string key_name(const std::string& key);

// The keys of RopeParams ("layout", "rotary_dim", "theta", "rope_type", ..., "seq_len"), in order.
const std::vector<std::string>& rope_keys();
// Sets the RopeParams field `key` from text; p is unchanged on error (which names the key).
Status set_rope_param(RopeParams* p, const std::string& key, const std::string& value);

// Sets an AttentionParams field: causal, scale, q_offset, k_offset, or a non-tensor registry
// parameter of p->encoding (RoPE's keys for rope, mrope and xpos). p is unchanged on error.
Status set_attention_param(AttentionParams* p, const std::string& key, const std::string& value);
// The same for the encoding's own keys only (not the call's causal, scale, offsets, keys_rotated,
// bf16_rate): what a position-only bias reads.
Status set_encoding_param(AttentionParams* p, const std::string& key, const std::string& value);

// The tensor of t (or gradient of g) that the registry names `name` for `enc` ("weights", "v_bias",
// "mlp_w1", "freqs", and "q_positions"/"k_positions" for rope2d and mrope), or an error naming it.
Expected<View*> encoding_tensor(Encoding enc, EncodingTensors* t, const std::string& name);
Expected<View*> encoding_grad(Encoding enc, EncodingGrads* g, const std::string& name);

}  // namespace posenc::text
