// Shared by the pass registry tests (tests/pass_registry_test.cpp: what lists pass keys;
// tests/pass_order_test.cpp: order, duplicate and drift checks): a pass that is only a PassInfo.
// (The message of an ft::Error an action throws: config_test::error_of, tests/config_test_util.h.)
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fusion/pass.h"

namespace ft {
namespace pass_registry_test {

inline bool g_toy_on = true;  // the test passes' switch (a real pass's lives in FusionOptions)

// A pass whose PassInfo names only `after`, and which rewrites nothing.
class NamedPass : public FusionPass {
 public:
  explicit NamedPass(PassInfo info) : info_(std::move(info)) {}
  const PassInfo& info() const override { return info_; }
  int apply(Graph&, PassContext&) const override { return 0; }

 private:
  PassInfo info_;
};

inline std::unique_ptr<FusionPass> named_pass(const char* name, std::vector<std::string> after) {
  return std::make_unique<NamedPass>(PassInfo{name,
                                              PassFamily::kHorizontal,
                                              +[](FusionOptions&) { return &g_toy_on; },
                                              "",
                                              {},
                                              std::move(after),
                                              {},
                                              {}});
}

}  // namespace pass_registry_test
}  // namespace ft
