// Counts the YAML documents of a text without building them, with a bound. yaml-cpp 0.7's
// YAML::LoadAll never ends on a token that begins no node (a stray ',', '!' or '&a ' where a
// value should start): its parser reports an empty document at the same place on every turn,
// and LoadAll keeps them all until memory runs out (yaml-cpp issue 1040, fixed after 0.7). This
// scan stops at `cap` documents and recognises the stuck parser by a document that starts where
// the previous one did.
// Thread safety: a pure function.
#pragma once
#include <string>

namespace ft {

struct YamlDocuments {
  int count = 0;        // documents found, at most cap
  bool capped = false;  // there may be more than cap
  bool stuck = false;   // the parser made no progress: the text has a token that begins nothing
  int line = 0;         // 0-based: where the stuck parser, else the second document, starts
  int column = 0;
};

// Throws YAML::Exception (with its mark) on a syntax error yaml-cpp detects.
YamlDocuments scan_yaml_documents(const std::string& text, int cap = 64);

}  // namespace ft
