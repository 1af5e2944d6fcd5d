// posenc list [--json] — the catalogue, straight from the registry.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/cli_common.h"

namespace posenc::cli {

namespace {

struct ListState {
  bool json = false;
};

void run_list(const ListState& st) {
  if (!st.json) {
    print_catalogue();
    return;
  }
  nlohmann::json out = nlohmann::json::array();
  for (const EncodingInfo& e : registry()) {
    nlohmann::json params = nlohmann::json::array();
    for (const ParamSpec& p : e.params) {
      params.push_back(
          {{"name", p.name},
           {"type", p.type},
           {"default", p.default_.empty() ? nlohmann::json(nullptr) : nlohmann::json(p.default_)},
           {"choices", p.choices},
           {"help", p.help},
           {"learned", p.learned}});
    }
    out.push_back({{"name", e.name},
                   {"kind", kind_name(e.kind)},
                   {"summary", e.summary},
                   {"paper", e.paper},
                   {"params", params}});
  }
  std::printf("%s\n", out.dump(2).c_str());
}

}  // namespace

Command add_list_command(CLI::App& root) {
  auto st = std::make_shared<ListState>();
  CLI::App* app = root.add_subcommand("list", "print the catalogue of encodings (from the registry)");
  app->allow_extras();
  app->add_flag("--json", st->json, "print a JSON array of {name, kind, summary, paper, params}")
      ->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  return {app, [st] { run_list(*st); }};
}

}  // namespace posenc::cli
