// Slurm's compressed host list ("node[01-03,07]", "a,b[1-2]", "rack[1-2]-n[1-2]"), expanded in
// time and memory linear in its output, and only after the output's size is known to be within
// bounds: a short list can name a cross product of ranges (6 ranges of 10 already name a million
// hosts), so the size is computed from the parsed list first and a list over the bounds is refused
// before anything is built.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <distribute/cluster/detail/env.hpp>
#include <distribute/core/error.hpp>
#include <distribute/core/host_name.hpp>

DISTRIBUTE_BEGIN_NAMESPACE
namespace cluster::detail {

/// Slurm's numbers, and the host names one list expands to, are at most this many: large enough
/// for any real cluster, small enough that a typo such as "node[1-99999999]" is an error and not
/// an out-of-memory.
inline constexpr std::int64_t kSlurmMaxCount = 1'000'000;
/// The text of the host names one list expands to (their lengths summed) is at most this: 16 MiB,
/// e.g. a million names of 16 bytes. A million names of 300 bytes would be refused.
inline constexpr std::int64_t kSlurmMaxHostlistBytes = std::int64_t{16} << 20;

/// "0-3" → {0, 3, 1} (low, high, digits of low): one item of a hostlist range.
struct SlurmRangeItem {
  std::int64_t low = 0;
  std::int64_t high = 0;
  std::size_t width = 0;
};

/// One part of a host name pattern: a literal (no items), or a bracketed list of ranges.
struct SlurmPart {
  std::string_view literal;
  std::vector<SlurmRangeItem> items;
  std::int64_t count = 1;     // values this part takes
  std::size_t max_bytes = 0;  // the longest of them
};

inline std::optional<std::int64_t> slurm_number(std::string_view s) {
  if (s.empty() || s.size() > 9 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return parse_env_integer(s);
}

/// `text` as messages quote it: whole, or its first 64 bytes and its length.
inline std::string slurm_quote(std::string_view text) {
  if (text.size() <= 256) return fmt::format("'{}'", text);
  return fmt::format("'{}...' ({} bytes)", text.substr(0, 64), text.size());
}

/// Expands Slurm's compressed host list: "node[01-03,07]", "a,b[1-2]", "rack[1-2]-n[1-2]".
/// Zero padding follows the low end of each range ("[08-10]" → 08, 09, 10); several ranges in
/// one name expand left to right, the leftmost varying slowest. `label` starts every message.
/// ClusterConfigError for a malformed list, one that names more than kSlurmMaxCount hosts or
/// kSlurmMaxHostlistBytes of names, or a name longer than 253 bytes.
inline std::vector<std::string> slurm_expand_hostlist(std::string_view text, std::string_view label) {
  auto fail = [&](const std::string& why) -> std::vector<std::string> {
    throw ClusterConfigError(fmt::format("{} {} is not a valid hostlist: {}", label, slurm_quote(text), why));
  };
  if (text.empty()) return fail("it is empty");

  // Pass 1: parse every element into parts and add up what it expands to.
  std::vector<std::vector<SlurmPart>> elements;
  std::int64_t total_names = 0, total_bytes = 0;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    // One comma-separated element (commas inside brackets separate range items, not hosts).
    std::size_t end = pos;
    bool in_brackets = false;
    for (; end < text.size(); ++end) {
      char c = text[end];
      if (c == '[') {
        if (in_brackets) return fail(fmt::format("'[' at offset {} is nested in another '['", end));
        in_brackets = true;
      } else if (c == ']') {
        if (!in_brackets) return fail(fmt::format("']' at offset {} has no matching '['", end));
        in_brackets = false;
      } else if (c == ',' && !in_brackets) {
        break;
      }
    }
    if (in_brackets) return fail("a '[' is never closed");
    std::string_view element = text.substr(pos, end - pos);
    if (element.empty()) return fail(fmt::format("empty host name at offset {}", pos));
    const std::string shown = slurm_quote(element);

    std::vector<SlurmPart> parts;
    std::int64_t names = 1;
    std::int64_t name_bytes = 0;  // of the longest name
    std::size_t i = 0;
    while (i < element.size()) {
      SlurmPart part;
      if (element[i] != '[') {
        std::size_t j = element.find('[', i);
        part.literal = element.substr(i, j == std::string_view::npos ? std::string_view::npos : j - i);
        if (auto bad = std::find_if_not(part.literal.begin(), part.literal.end(), is_hostname_char); bad != part.literal.end()) {
          return fail(fmt::format("host name {} has the invalid character '{}'", shown, *bad));
        }
        part.max_bytes = part.literal.size();
        i += part.literal.size();
      } else {
        std::size_t close = element.find(']', i);
        std::string_view range = element.substr(i + 1, close - i - 1);
        if (range.empty()) return fail(fmt::format("{} has an empty range '[]'", shown));
        part.count = 0;
        std::size_t start = 0;
        while (start <= range.size()) {
          std::size_t comma = std::min(range.find(',', start), range.size());
          std::string_view item = range.substr(start, comma - start);
          std::size_t dash = item.find('-');
          std::string_view lo = item.substr(0, dash);
          std::string_view hi = dash == std::string_view::npos ? lo : item.substr(dash + 1);
          auto l = slurm_number(lo);
          auto h = slurm_number(hi);
          if (!l || !h) return fail(fmt::format("range item '{}' in {} is not N or N-M with decimal numbers", item, shown));
          if (*h < *l) return fail(fmt::format("range item '{}' in {} goes down", item, shown));
          part.items.push_back({*l, *h, lo.size()});
          part.count += *h - *l + 1;
          if (part.count > kSlurmMaxCount) return fail(fmt::format("{} names more than {} hosts", shown, kSlurmMaxCount));
          part.max_bytes = std::max({part.max_bytes, lo.size(), fmt::formatted_size("{}", *h)});
          start = comma + 1;
        }
        i = close + 1;
      }
      // names and name_bytes stay <= kSlurmMaxCount and the element's length x 9: no overflow.
      if (names > kSlurmMaxCount / part.count) return fail(fmt::format("{} names more than {} hosts", shown, kSlurmMaxCount));
      names *= part.count;
      name_bytes += static_cast<std::int64_t>(part.max_bytes);
      parts.push_back(std::move(part));
    }
    total_names += names;
    if (total_names > kSlurmMaxCount) return fail(fmt::format("it names more than {} hosts", kSlurmMaxCount));
    total_bytes += names * name_bytes;  // <= 1e6 x (16 MiB x 9): fits
    if (total_bytes > kSlurmMaxHostlistBytes) {
      return fail(fmt::format("it expands to more than {} MiB of host names", kSlurmMaxHostlistBytes >> 20));
    }
    elements.push_back(std::move(parts));
    if (end == text.size()) break;
    pos = end + 1;
    if (pos == text.size()) return fail("it ends with ','");
  }

  // Pass 2: an odometer over each element's parts (the last varies fastest). `prefix[k]` is the
  // length of the name before part k, so a step rewrites only the parts that changed.
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<std::size_t>(total_names));
  for (const auto& parts : elements) {
    const std::size_t n = parts.size();
    std::vector<std::size_t> item(n, 0), prefix(n, 0);
    std::vector<std::int64_t> value(n, 0);
    std::string name;
    auto append = [&](std::size_t k) {
      prefix[k] = name.size();
      const SlurmPart& p = parts[k];
      if (p.items.empty()) {
        name += p.literal;
      } else {
        fmt::format_to(std::back_inserter(name), "{:0{}}", value[k], p.items[item[k]].width);
      }
    };
    for (std::size_t k = 0; k < n; ++k) {
      if (!parts[k].items.empty()) value[k] = parts[k].items[0].low;
      append(k);
    }
    for (;;) {
      if (name.size() > kMaxHostNameBytes) return fail(host_problem(name, false));
      hosts.push_back(name);
      // Advance the rightmost part that has values left; reset the parts after it.
      std::size_t k = n;
      while (k > 0) {
        const SlurmPart& p = parts[k - 1];
        if (!p.items.empty()) {
          if (value[k - 1] < p.items[item[k - 1]].high) {
            ++value[k - 1];
            break;
          }
          if (item[k - 1] + 1 < p.items.size()) {
            ++item[k - 1];
            value[k - 1] = p.items[item[k - 1]].low;
            break;
          }
        }
        --k;
      }
      if (k == 0) break;
      name.resize(prefix[k - 1]);
      append(k - 1);
      for (std::size_t m = k; m < n; ++m) {
        item[m] = 0;
        if (!parts[m].items.empty()) value[m] = parts[m].items[0].low;
        append(m);
      }
    }
  }
  return hosts;
}

}  // namespace cluster::detail
DISTRIBUTE_END_NAMESPACE
