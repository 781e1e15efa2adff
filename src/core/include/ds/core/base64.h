// Base64 (RFC 4648): dsrun's --world_info travels URL-safe encoded (as DeepSpeed's), and a
// config may be given as base64 JSON text (as DeepSpeed's initialize() accepts).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ds {

// The URL-safe alphabet (RFC 4648 section 5: '-' and '_') with '=' padding, as Python's
// base64.urlsafe_b64encode.
std::string base64_urlsafe_encode(std::string_view bytes);

// Decodes either alphabet (sections 4 and 5, also mixed); '=' padding is optional. Throws
// ds::Error on a character of neither alphabet ("bad base64 character 'C'") or a length no
// encoding has ("bad base64 length").
std::string base64_decode(std::string_view text);
// The same, nullopt where base64_decode throws.
std::optional<std::string> try_base64_decode(std::string_view text);

}  // namespace ds
