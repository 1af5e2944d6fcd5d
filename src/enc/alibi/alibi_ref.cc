// PLACEHOLDER until the reference lands.
#include "posenc/bias.h"
#include "enc/alibi/alibi_math.h"
namespace posenc {
const char* alibi_variant_name(AlibiVariant v) {
  return v == AlibiVariant::kSymmetric ? "symmetric" : v == AlibiVariant::kNonsymmetric ? "nonsymmetric" : "learned";
}
Expected<AlibiVariant> parse_alibi_variant(const std::string& s) {
  if (s == "symmetric") return AlibiVariant::kSymmetric;
  if (s == "nonsymmetric") return AlibiVariant::kNonsymmetric;
  if (s == "learned") return AlibiVariant::kLearned;
  return Status::Invalid("variant", "expected symmetric, nonsymmetric or learned, got '" + s + "'");
}
std::vector<double> alibi_slopes(std::int64_t heads) { return alibi::slopes(heads); }
Status alibi_bias(const AlibiParams&, const BiasGeometry&, const View&, const View&, const View&) {
  return Status::Internal("not implemented yet");
}
Status alibi_bias_backward(const AlibiParams&, const BiasGeometry&, const View&, const View&, const View&) {
  return Status::Internal("not implemented yet");
}
}  // namespace posenc
