// SHA-256 digests (OpenSSL's libcrypto), for recording which checkpoint an export came from.
// Thread safety: reentrant.
#pragma once
#include <string>

namespace ft {

// Lower-case hex SHA-256 of `bytes`.
std::string sha256_hex(const std::string& bytes);

}  // namespace ft
