// The Constraint of a compiled program (an automaton, a schema graph, a grammar) that many
// matchers share: each completion's matcher starts from the program.
#pragma once

#include <memory>
#include <utility>

#include "structured/structured.h"

namespace deepinfer::structured {

template <typename MatcherType, typename Program>
class ProgramConstraint final : public Constraint {
 public:
  explicit ProgramConstraint(std::shared_ptr<const Program> program)
      : program_(std::move(program)) {}
  std::unique_ptr<Matcher> start() const override {
    return std::make_unique<MatcherType>(program_);
  }

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace deepinfer::structured
