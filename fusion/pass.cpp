#include "fusion/pass.h"

namespace ft {

const char* pass_family_name(PassFamily family) {
  switch (family) {
    case PassFamily::kVertical:
      return "vertical";
    case PassFamily::kHorizontal:
      return "horizontal";
    case PassFamily::kInference:
      return "inference";
  }
  return "?";
}

std::string PassInfo::key() const {
  if (family == PassFamily::kInference) return std::string("inference.") + name;
  return std::string("fusion.") + pass_family_name(family) + "." + name;
}

}  // namespace ft
