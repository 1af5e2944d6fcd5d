#pragma once
// Integers read from the study's JSON files (checkpoint configs, plans, results), refusing what
// get<std::int64_t>() would convert silently or with undefined behaviour.
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace posenc {

// What v is, for an error: a number as written, anything else by its type's name.
inline std::string json_what(const nlohmann::json& v) { return v.is_number() ? v.dump() : v.type_name(); }

// v as int64_t; throws nlohmann::json::type_error unless v is a JSON integer within int64_t (a
// float such as 4e40, or 2^63, is refused, never converted).
inline std::int64_t json_int(const nlohmann::json& v) {
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() && v.get<std::uint64_t>() > std::uint64_t(std::numeric_limits<std::int64_t>::max())))
    throw nlohmann::json::type_error::create(302, "expected an integer within int64, got " + json_what(v), &v);
  return v.get<std::int64_t>();
}

// v as uint64_t; throws nlohmann::json::type_error unless v is a non-negative JSON integer.
inline std::uint64_t json_uint(const nlohmann::json& v) {
  if (!v.is_number_unsigned())
    throw nlohmann::json::type_error::create(302, "expected a non-negative integer, got " + json_what(v), &v);
  return v.get<std::uint64_t>();
}

// v as int64_t values; throws nlohmann::json::type_error unless v is an array of json_int values.
inline std::vector<std::int64_t> json_ints(const nlohmann::json& v) {
  if (!v.is_array()) throw nlohmann::json::type_error::create(302, "expected an array of integers, got " + json_what(v), &v);
  std::vector<std::int64_t> out;
  for (const nlohmann::json& e : v) out.push_back(json_int(e));
  return out;
}

}  // namespace posenc
