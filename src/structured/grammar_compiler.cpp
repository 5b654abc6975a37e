// From GrammarSource to Cfg. Every expression that reaches no recursive rule is regular: it
// becomes one terminal automaton (a run of regular items in a sequence becomes one, so that
// `"{" ws` or `[a-z]+ "."` are a single terminal), which keeps the Earley chart to the
// grammar's real structure. What is left becomes productions; repeats of structure become
// left-recursive rules, which Earley parses in constant work a step.
#include <fmt/format.h>

#include "structured/grammar.h"

namespace deepinfer::structured {
namespace {

// An inlined rule is copied into every terminal that uses it: past this many regex nodes a
// regular rule stays a rule of its own.
constexpr size_t kMaxInlineNodes = 4000;
constexpr size_t kMaxSymbols = 400000;
// All terminals together: bounds the time their automata take to build.
constexpr size_t kMaxTerminalNodes = 400000;

class Lowering {
 public:
  explicit Lowering(const GrammarSource& source)
      : source_(source),
        tree_(source.terminals),
        expr_regular_(source.exprs.size(), kUnknown),
        expr_size_(source.exprs.size(), 0),
        rule_state_(source.rules.size(), kUnknown),
        rule_size_(source.rules.size(), 0),
        rule_regex_(source.rules.size(), -1),
        rule_cfg_(source.rules.size(), -1) {}

  Cfg run() {
    for (const GrammarSource::Rule& rule : source_.rules)
      if (rule.body < 0)
        throw GrammarError(fmt::format("grammar: rule '{}' is used but never defined", rule.name));
    if (source_.start < 0) throw GrammarError("grammar: no start rule");
    const int start_rule = new_rule();
    std::vector<Cfg::Symbol> start;
    lower_rule_ref(source_.start, start);
    cfg_.start_production = add_production(start_rule, std::move(start));
    while (!pending_.empty()) {
      const int rule = pending_.back();
      pending_.pop_back();
      lower_body(source_.rules[static_cast<size_t>(rule)].body,
                 rule_cfg_[static_cast<size_t>(rule)]);
    }
    drop_unproductive(source_.rules[static_cast<size_t>(source_.start)].name);
    settle_nullable();
    return std::move(cfg_);
  }

 private:
  enum : uint8_t { kUnknown, kVisiting, kRegular, kStructural };

  const GrammarExpr& expr(int index) const { return source_.exprs[static_cast<size_t>(index)]; }

  // Whether the expression reaches no rule that reaches itself (and inlines small enough).
  bool regular(int index) {
    uint8_t& known = expr_regular_[static_cast<size_t>(index)];
    if (known != kUnknown) return known == kRegular;
    const GrammarExpr& e = expr(index);
    bool is_regular = true;
    size_t size = 1;
    if (e.kind == GrammarExpr::Kind::kRule) {
      is_regular = rule_regular(e.rule);
      size = rule_size_[static_cast<size_t>(e.rule)];
    } else {
      for (int child : e.children) {
        is_regular = regular(child) && is_regular;
        size += expr_size_[static_cast<size_t>(child)];
      }
      if (e.kind == GrammarExpr::Kind::kRepeat) size *= static_cast<size_t>(std::max(1, e.min));
    }
    expr_size_[static_cast<size_t>(index)] = std::min(size, kMaxInlineNodes + 1);
    is_regular = is_regular && size <= kMaxInlineNodes;
    known = is_regular ? kRegular : kStructural;
    return is_regular;
  }

  bool rule_regular(int rule) {
    uint8_t& state = rule_state_[static_cast<size_t>(rule)];
    if (state == kVisiting) return false;  // recursion: structure
    if (state != kUnknown) return state == kRegular;
    state = kVisiting;
    const int body = source_.rules[static_cast<size_t>(rule)].body;
    const bool is_regular = regular(body);
    rule_size_[static_cast<size_t>(rule)] = expr_size_[static_cast<size_t>(body)];
    rule_state_[static_cast<size_t>(rule)] = is_regular ? kRegular : kStructural;
    return is_regular;
  }

  int to_regex(int index) {
    const GrammarExpr& e = expr(index);
    switch (e.kind) {
      case GrammarExpr::Kind::kTerminal:
        return e.terminal;
      case GrammarExpr::Kind::kRule: {
        int& made = rule_regex_[static_cast<size_t>(e.rule)];
        if (made < 0) made = to_regex(source_.rules[static_cast<size_t>(e.rule)].body);
        return made;
      }
      case GrammarExpr::Kind::kRepeat: {
        RegexNode node;
        node.kind = RegexNode::Kind::kRepeat;
        node.children = {to_regex(e.children[0])};
        node.min = e.min;
        node.max = e.max;
        return tree_.add(std::move(node));
      }
      default: {
        RegexNode node;
        node.kind = e.kind == GrammarExpr::Kind::kSequence ? RegexNode::Kind::kConcat
                                                           : RegexNode::Kind::kAlternation;
        for (int child : e.children) node.children.push_back(to_regex(child));
        return tree_.add(std::move(node));
      }
    }
  }

  // The terminal of regex node `node`; none when its language is only the empty text.
  void add_terminal(int node, size_t size, std::vector<Cfg::Symbol>& out) {
    auto [found, added] = terminal_of_node_.emplace(node, -1);
    if (added) {
      terminal_nodes_ += size;
      if (terminal_nodes_ > kMaxTerminalNodes)
        throw GrammarError(fmt::format(
            "grammar: its terminals hold more than {} pattern nodes once rules are inlined",
            kMaxTerminalNodes));
      tree_.root = node;
      auto dfa = std::make_unique<ByteDfa>(tree_);
      if (!(dfa->accepting(ByteDfa::kStart) && dfa->final(ByteDfa::kStart))) {
        if (cfg_.terminals.size() >= Cfg::kMaxTerminals)
          throw GrammarError(fmt::format("grammar: more than {} terminals", Cfg::kMaxTerminals));
        cfg_.terminal_nullable.push_back(dfa->accepting(ByteDfa::kStart) ? 1 : 0);
        cfg_.terminals.push_back(std::move(dfa));
        found->second = static_cast<int>(cfg_.terminals.size()) - 1;
      }
    }
    if (found->second >= 0) push(out, {found->second, true});
  }

  void push(std::vector<Cfg::Symbol>& out, Cfg::Symbol symbol) {
    if (++symbols_ > kMaxSymbols)
      throw GrammarError(
          fmt::format("grammar: more than {} symbols once repeats are written out", kMaxSymbols));
    out.push_back(symbol);
  }

  void lower_rule_ref(int rule, std::vector<Cfg::Symbol>& out) {
    if (rule_regular(rule)) {
      add_terminal(to_regex(source_.rules[static_cast<size_t>(rule)].body),
                   rule_size_[static_cast<size_t>(rule)], out);
      return;
    }
    int& made = rule_cfg_[static_cast<size_t>(rule)];
    if (made < 0) {
      made = new_rule();
      pending_.push_back(rule);
    }
    push(out, {made, false});
  }

  // The body's alternatives become the rule's productions.
  void lower_body(int body, int cfg_rule) {
    const GrammarExpr& e = expr(body);
    if (e.kind == GrammarExpr::Kind::kAlternation && !regular(body)) {
      for (int child : e.children) lower_production(child, cfg_rule);
    } else {
      lower_production(body, cfg_rule);
    }
  }

  void lower_production(int index, int cfg_rule) {
    std::vector<Cfg::Symbol> symbols;
    lower_into(index, symbols);
    add_production(cfg_rule, std::move(symbols));
  }

  void lower_into(int index, std::vector<Cfg::Symbol>& out) {
    const GrammarExpr& e = expr(index);
    if (regular(index))
      return add_terminal(to_regex(index), expr_size_[static_cast<size_t>(index)], out);
    switch (e.kind) {
      case GrammarExpr::Kind::kRule:
        return lower_rule_ref(e.rule, out);
      case GrammarExpr::Kind::kSequence:
        return lower_sequence(e, out);
      case GrammarExpr::Kind::kAlternation: {
        const int rule = new_rule();
        lower_body(index, rule);
        return push(out, {rule, false});
      }
      case GrammarExpr::Kind::kRepeat:
        return lower_repeat(e, out);
      case GrammarExpr::Kind::kTerminal:
        return add_terminal(e.terminal, 1, out);
    }
  }

  // Neighbouring regular items make one terminal (up to kMaxInlineNodes).
  void lower_sequence(const GrammarExpr& e, std::vector<Cfg::Symbol>& out) {
    RegexNode run;
    run.kind = RegexNode::Kind::kConcat;
    size_t run_size = 0;
    auto flush = [&] {
      if (run.children.empty()) return;
      const int node = run.children.size() == 1 ? run.children[0] : tree_.add(run);
      add_terminal(node, run_size, out);
      run.children.clear();
      run_size = 0;
    };
    for (int child : e.children) {
      if (regular(child)) {
        const size_t size = expr_size_[static_cast<size_t>(child)];
        if (run_size + size > kMaxInlineNodes) flush();
        run_size += size;
        run.children.push_back(to_regex(child));
      } else {
        flush();
        lower_into(child, out);
      }
    }
    flush();
  }

  // X{m,n}: X m times, then n - m nested optional X (X* past m: a left-recursive rule).
  void lower_repeat(const GrammarExpr& e, std::vector<Cfg::Symbol>& out) {
    std::vector<Cfg::Symbol> item;
    lower_into(e.children[0], item);
    if (item.size() != 1) {
      const int rule = new_rule();
      add_production(rule, std::move(item));
      item = {{rule, false}};
    }
    for (int i = 0; i < e.min; ++i) push(out, item[0]);
    if (e.max < 0) {
      const int many = new_rule();
      add_production(many, {});
      add_production(many, {{many, false}, item[0]});
      return push(out, {many, false});
    }
    int tail = -1;
    for (int i = e.min; i < e.max; ++i) {
      const int optional = new_rule();
      add_production(optional, {});
      std::vector<Cfg::Symbol> more{item[0]};
      if (tail >= 0) more.push_back({tail, false});
      add_production(optional, std::move(more));
      tail = optional;
    }
    if (tail >= 0) push(out, {tail, false});
  }

  int new_rule() {
    cfg_.rule_productions.emplace_back();
    return static_cast<int>(cfg_.rule_productions.size()) - 1;
  }

  int add_production(int rule, std::vector<Cfg::Symbol> symbols) {
    if (cfg_.productions.size() >= Cfg::kMaxProductions)
      throw GrammarError(
          fmt::format("grammar: more than {} productions once written out", Cfg::kMaxProductions));
    cfg_.productions.push_back({rule, std::move(symbols)});
    const auto index = static_cast<int32_t>(cfg_.productions.size()) - 1;
    cfg_.rule_productions[static_cast<size_t>(rule)].push_back(index);
    return index;
  }

  // Productions using a rule that derives no text can never complete: dropped, so that every
  // prefix the matcher allows can still be finished. A start rule left with none is an error.
  void drop_unproductive(const std::string& start_name) {
    std::vector<uint8_t> terminal_ok(cfg_.terminals.size(), 0);
    for (size_t t = 0; t < cfg_.terminals.size(); ++t)
      for (int state = ByteDfa::kStart; state < cfg_.terminals[t]->size() && !terminal_ok[t];
           ++state)
        terminal_ok[t] = cfg_.terminals[t]->accepting(state) ? 1 : 0;
    std::vector<uint8_t> rule_ok(cfg_.rule_productions.size(), 0);
    auto productive = [&](const Cfg::Production& p) {
      return std::all_of(p.symbols.begin(), p.symbols.end(), [&](Cfg::Symbol symbol) {
        return (symbol.terminal ? terminal_ok : rule_ok)[static_cast<size_t>(symbol.id)] != 0;
      });
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (const Cfg::Production& p : cfg_.productions)
        if (!rule_ok[static_cast<size_t>(p.rule)] && productive(p))
          rule_ok[static_cast<size_t>(p.rule)] = 1, changed = true;
    }
    if (!rule_ok[static_cast<size_t>(
            cfg_.productions[static_cast<size_t>(cfg_.start_production)].rule)])
      throw GrammarError(fmt::format("grammar: rule '{}' derives no text", start_name));
    for (std::vector<int32_t>& productions : cfg_.rule_productions)
      std::erase_if(productions, [&](int32_t p) {
        return !productive(cfg_.productions[static_cast<size_t>(p)]);
      });
  }

  void settle_nullable() {
    cfg_.rule_nullable.assign(cfg_.rule_productions.size(), 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (const Cfg::Production& p : cfg_.productions) {
        if (cfg_.rule_nullable[static_cast<size_t>(p.rule)]) continue;
        const bool nullable = std::all_of(p.symbols.begin(), p.symbols.end(), [&](auto s) {
          return s.terminal ? cfg_.terminal_nullable[static_cast<size_t>(s.id)] != 0
                            : cfg_.rule_nullable[static_cast<size_t>(s.id)] != 0;
        });
        if (nullable) cfg_.rule_nullable[static_cast<size_t>(p.rule)] = 1, changed = true;
      }
    }
  }

  const GrammarSource& source_;
  RegexTree tree_;
  Cfg cfg_;
  std::vector<uint8_t> expr_regular_;
  std::vector<size_t> expr_size_;
  std::vector<uint8_t> rule_state_;
  std::vector<size_t> rule_size_;
  std::vector<int> rule_regex_, rule_cfg_, pending_;
  std::map<int, int> terminal_of_node_;
  size_t symbols_ = 0, terminal_nodes_ = 0;
};

}  // namespace

Cfg Cfg::lower(const GrammarSource& source) {
  return Lowering(source).run();
}

}  // namespace deepinfer::structured
