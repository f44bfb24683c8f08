#include "app/config/yaml_documents.h"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <sstream>

namespace ft {
namespace {

// Remembers where each document starts; ignores everything inside.
class DocumentStarts : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    previous = current;
    current = mark;
    if (++count == 2) second = mark;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}

  int count = 0;
  YAML::Mark previous = YAML::Mark::null_mark(), current = YAML::Mark::null_mark();
  YAML::Mark second = YAML::Mark::null_mark();
};

bool same_place(const YAML::Mark& a, const YAML::Mark& b) {
  return a.pos == b.pos && a.line == b.line && a.column == b.column;
}

}  // namespace

YamlDocuments scan_yaml_documents(const std::string& text, int cap) {
  std::istringstream input(text);
  YAML::Parser parser(input);
  DocumentStarts starts;
  YamlDocuments result;
  while (starts.count < cap && parser.HandleNextDocument(starts)) {
    if (starts.count >= 2 && same_place(starts.previous, starts.current)) {
      result.stuck = true;
      break;
    }
  }
  result.count = starts.count;
  result.capped = starts.count >= cap && !result.stuck;
  if (result.stuck || starts.count >= 2) {
    const YAML::Mark& where = result.stuck ? starts.current : starts.second;
    result.line = where.line;
    result.column = where.column;
  }
  return result;
}

}  // namespace ft
