// SHA-256 digests (OpenSSL's libcrypto), for recording which checkpoint an export came from.
// Thread safety: reentrant.
#pragma once
#include <string>

namespace ft {

// Lower-case hex SHA-256 of the file at `path`, read in chunks. Throws ft::Error naming the path
// when it cannot be read.
std::string sha256_hex_of_file(const std::string& path);

}  // namespace ft
