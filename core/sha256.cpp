#include "core/sha256.h"

#include <openssl/evp.h>

#include <fstream>
#include <memory>
#include <vector>

#include "core/check.h"

namespace ft {
namespace {

std::string hex(const unsigned char* digest, unsigned int length) {
  static const char kHex[] = "0123456789abcdef";
  std::string text;
  for (unsigned int i = 0; i < length; ++i) {
    text += kHex[digest[i] >> 4];
    text += kHex[digest[i] & 15];
  }
  return text;
}

}  // namespace

std::string sha256_hex_of_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FT_REQUIRE(in.good(), "cannot read '", path, "'");
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                  &EVP_MD_CTX_free);
  FT_CHECK(context && EVP_DigestInit_ex(context.get(), EVP_sha256(), nullptr) == 1,
           "sha256: OpenSSL EVP_DigestInit_ex failed");
  std::vector<char> chunk(1 << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    if (in.gcount() > 0)
      FT_CHECK(EVP_DigestUpdate(context.get(), chunk.data(), in.gcount()) == 1,
               "sha256: OpenSSL EVP_DigestUpdate failed");
  }
  FT_REQUIRE(in.eof(), "error while reading '", path, "'");
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  FT_CHECK(EVP_DigestFinal_ex(context.get(), digest, &length) == 1,
           "sha256: OpenSSL EVP_DigestFinal_ex failed");
  return hex(digest, length);
}

}  // namespace ft
