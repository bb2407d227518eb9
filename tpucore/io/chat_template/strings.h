// Python's str methods on UTF-8 strings (Unicode whitespace and case rules as CPython applies
// them, case mapping through ICU), for the chat-template interpreter.
#pragma once

#include <string>
#include <vector>

namespace tpu::jinja {

/// str.strip() / lstrip() / rstrip() without argument: Unicode whitespace.
std::string py_strip(const std::string& s, bool left, bool right);
/// str.strip(chars): any of the code points of `chars`.
std::string py_strip_chars(const std::string& s, const std::string& chars, bool left, bool right);
/// str.split(sep, maxsplit) and str.rsplit; sep null splits on runs of whitespace.
std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit, bool from_right);
/// str.splitlines().
std::vector<std::string> py_splitlines(const std::string& s);
/// str.upper(), lower(), title(), capitalize().
std::string py_case(const std::string& s, const std::string& how);
/// str.replace(old, new, count).
std::string py_replace(const std::string& s, const std::string& a, const std::string& b, int64_t count);
/// str.count(sub).
int64_t py_count(const std::string& s, const std::string& sub);
/// str.isdigit(), isalpha(), isspace(), isupper(), islower(), isalnum().
bool py_is(const std::string& s, const std::string& what);

}  // namespace tpu::jinja
