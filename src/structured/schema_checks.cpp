// Checks over a compiled SchemaGraph: oneOf branches told apart (or narrowed until they are),
// and unions that reach a shape.
#include <algorithm>
#include <set>

#include "structured/json_schema.h"

namespace deepinfer::structured {
namespace {

[[noreturn]] void refuse(const std::string& pointer, const std::string& what) {
  throw GrammarError(fmt::format("json_schema: {} (at {})", what, pointer));
}

class OneOfChecks {
 public:
  explicit OneOfChecks(SchemaGraph& graph) : graph_(graph) {}

  // oneOf is enforced where its branches can be told apart: types only one branch takes,
  // objects with a required property whose shapes do not meet (or that the other forbids),
  // disjoint enums. Values of a type two branches both take, and cannot be told apart in, match
  // two branches and so none: the branches lose that type (a copy of the node, shared nodes
  // stay). Other oneOf are refused.
  void settle(const std::vector<std::pair<int, std::string>>& one_of) {
    for (const auto& [index, pointer] : one_of) {
      std::vector<int> branches = graph_.nodes[static_cast<size_t>(index)].any_of;
      std::vector<uint8_t> shared(branches.size(), 0);
      for (size_t i = 0; i < branches.size(); ++i) {
        for (size_t j = i + 1; j < branches.size(); ++j) {
          const int common = overlap(branches[i], branches[j], 0);
          if (common < 0)
            refuse(pointer, fmt::format("oneOf: branches {} and {} cannot be told apart (only "
                                        "branches that exclude each other are supported)",
                                        i, j));
          shared[i] |= static_cast<uint8_t>(common);
          shared[j] |= static_cast<uint8_t>(common);
        }
      }
      for (size_t i = 0; i < branches.size(); ++i) {
        if (shared[i] == 0) continue;
        SchemaNode narrowed = graph_.nodes[static_cast<size_t>(branches[i])];
        const uint8_t left = narrowed.types & static_cast<uint8_t>(~shared[i]);
        // A number grammar cannot leave out integers, nor an enum its values of a type.
        if (!narrowed.any_of.empty() || narrowed.literals >= 0 ||
            ((left & kNumberType) && !(left & kIntegerType)))
          refuse(pointer, fmt::format("oneOf: branch {} shares values with another branch", i));
        if (left == 0)
          refuse(pointer, fmt::format("oneOf: branch {} cannot be told apart from the others", i));
        narrowed.types = left;
        if (graph_.nodes.size() >= SchemaGraph::kMaxNodes)
          throw GrammarError(
              fmt::format("json_schema: more than {} schema nodes", SchemaGraph::kMaxNodes));
        graph_.nodes.push_back(std::move(narrowed));
        branches[i] = static_cast<int>(graph_.nodes.size()) - 1;
      }
      SchemaNode& node = graph_.nodes[static_cast<size_t>(index)];
      node.any_of = std::move(branches);
      node.exclusive = true;
    }
  }

  const SchemaNode* known(int index) const {
    return index < 0 ? nullptr : &graph_.nodes[static_cast<size_t>(index)];
  }

  // The types in which some value matches both nodes (0: none); -1 when that cannot be told.
  int overlap(int a, int b, int depth) const {
    const SchemaNode* x = known(a);
    const SchemaNode* y = known(b);
    if (!x || !y || depth > 8) return -1;
    if (!x->any_of.empty()) {
      int all = 0;
      for (int option : x->any_of) {
        const int common = overlap(option, b, depth + 1);
        if (common < 0) return -1;
        all |= common;
      }
      return all;
    }
    if (!y->any_of.empty()) return overlap(b, a, depth);
    int common = x->types & y->types;
    if (common == 0) return 0;
    if (x->literals >= 0 || y->literals >= 0)
      return x->literals >= 0 && y->literals >= 0 && literals_disjoint(*x, *y) ? 0 : -1;
    if ((common & kObjectType) &&
        (objects_disjoint(*x, *y, depth) || objects_disjoint(*y, *x, depth)))
      common &= ~kObjectType;
    return common;
  }

  bool objects_disjoint(const SchemaNode& x, const SchemaNode& y, int depth) const {
    for (const SchemaNode::Property& p : x.properties) {
      if (!p.required) continue;
      auto other = std::find_if(y.properties.begin(), y.properties.end(),
                                [&](const SchemaNode::Property& q) { return q.name == p.name; });
      if (other == y.properties.end()) {
        if (!y.more_properties && y.pattern_properties.empty()) return true;  // y forbids it
      } else if (other->required && overlap(p.node, other->node, depth + 1) == 0) {
        return true;
      }
    }
    return false;
  }

  // No text both enum automata accept (a walk of the pair automaton, bounded).
  bool literals_disjoint(const SchemaNode& x, const SchemaNode& y) const {
    const ByteDfa& a = *graph_.automata[static_cast<size_t>(x.literals)];
    const ByteDfa& b = *graph_.automata[static_cast<size_t>(y.literals)];
    std::set<std::pair<int, int>> seen{{ByteDfa::kStart, ByteDfa::kStart}};
    std::vector<std::pair<int, int>> queue(seen.begin(), seen.end());
    while (!queue.empty()) {
      const auto [s, t] = queue.back();
      queue.pop_back();
      if (a.accepting(s) && b.accepting(t)) return false;
      for (int c = 0; c < 256; ++c) {
        const std::pair<int, int> next{a.next(s, static_cast<uint8_t>(c)),
                                       b.next(t, static_cast<uint8_t>(c))};
        if (next.first == ByteDfa::kDead || next.second == ByteDfa::kDead) continue;
        if (seen.size() > 100000) return false;
        if (seen.insert(next).second) queue.push_back(next);
      }
    }
    return true;
  }

 private:
  SchemaGraph& graph_;
};

}  // namespace

void settle_one_of(SchemaGraph& graph, const std::vector<std::pair<int, std::string>>& one_of) {
  OneOfChecks(graph).settle(one_of);
}

// A union whose branches lead only back to unions ($ref cycles such as a: {$ref: a}) names
// no shape at all.
void check_unions_end(const SchemaGraph& graph) {
  for (size_t index = 0; index < graph.nodes.size(); ++index) {
    if (graph.nodes[index].any_of.empty()) continue;
    std::vector<bool> seen(graph.nodes.size(), false);
    std::vector<int> stack{static_cast<int>(index)};
    bool ends = false;
    while (!stack.empty() && !ends) {
      const int at = stack.back();
      stack.pop_back();
      if (at < 0 || graph.nodes[static_cast<size_t>(at)].any_of.empty()) {
        ends = true;
      } else if (!seen[static_cast<size_t>(at)]) {
        seen[static_cast<size_t>(at)] = true;
        for (int option : graph.nodes[static_cast<size_t>(at)].any_of) stack.push_back(option);
      }
    }
    if (!ends) throw GrammarError("json_schema: a $ref cycle never reaches a schema");
  }
}

}  // namespace deepinfer::structured
