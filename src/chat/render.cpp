// Rendering parsed chat templates with bounded evaluation.
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "chat/ast.h"
#include "chat/builtins.h"
#include "chat/template.h"
#include "core/error.h"

namespace deepinfer::chat {
namespace {

// Template errors carry the line; the caller prefixes "chat template".
struct TemplateFailure {
  std::string message;
};

class Renderer {
 public:
  Renderer(const RenderLimits& limits, const nlohmann::ordered_json& context) : limits_(limits) {
    scopes_.emplace_back();
    if (!context.is_object()) fail("chat template: the context must be a JSON object");
    for (const auto& [key, value] : context.items()) scopes_[0][key] = Value::from_json(value);
  }

  std::string run(const Body& body) {
    render(body, output_);
    return std::move(output_);
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  void step(int line) {
    if (++steps_ > limits_.max_steps)
      fail("line {}: evaluation exceeded {} steps", line, limits_.max_steps);
  }

  Flow render(const Body& body, std::string& out) {
    for (const auto& node : body) {
      Flow flow = render_node(*node, out);
      if (flow != Flow::kNormal) return flow;
      if (out.size() > limits_.max_output_bytes)
        fail("line {}: output exceeds {} bytes", node->line, limits_.max_output_bytes);
    }
    return Flow::kNormal;
  }

  Flow render_node(const Node& node, std::string& out) {
    step(node.line);
    switch (node.type) {
      case Node::Type::kText:
        out += node.text;
        return Flow::kNormal;
      case Node::Type::kOutput:
        out += eval(*node.expr).str();
        return Flow::kNormal;
      case Node::Type::kIf:
        for (size_t i = 0; i < node.branches.size(); ++i) {
          if (i >= node.conditions.size() || eval(*node.conditions[i]).as_bool())
            return render(node.branches[i], out);
        }
        return Flow::kNormal;
      case Node::Type::kFor:
        return render_for(node, out);
      case Node::Type::kSet:
        assign(node, eval(*node.expr));
        return Flow::kNormal;
      case Node::Type::kSetBlock: {
        std::string body;
        render(node.branches[0], body);
        Value value(body);
        if (node.filter) value = apply_block_filter(*node.filter, value);
        assign(node, value);
        return Flow::kNormal;
      }
      case Node::Type::kMacro:
        define_macro(node);
        return Flow::kNormal;
      case Node::Type::kCallBlock:
        scopes_.emplace_back();
        scopes_.back()["caller"] = callable_body(node);
        out += eval(*node.expr).str();
        scopes_.pop_back();
        return Flow::kNormal;
      case Node::Type::kFilterBlock: {
        std::string body;
        render(node.branches[0], body);
        out += node.filter ? apply_block_filter(*node.filter, Value(body)).str() : body;
        return Flow::kNormal;
      }
      case Node::Type::kBreak:
        return Flow::kBreak;
      case Node::Type::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  Value apply_block_filter(const Expr& chain, const Value& body) {
    scopes_.emplace_back();
    scopes_.back()[kBlockBody] = body;
    Value result = eval(chain);
    scopes_.pop_back();
    return result;
  }

  void assign(const Node& node, const Value& value) {
    if (!node.attribute.empty()) {
      Value target = lookup(node.targets[0]);
      if (!target.is_dict())
        fail("line {}: cannot set attribute '{}' of {}", node.line, node.attribute,
             target.type_name());
      target.set(node.attribute, value);
      return;
    }
    if (node.targets.size() == 1) {
      scopes_.back()[node.targets[0]] = value;
      return;
    }
    const List& values = value.as_list();
    if (values.size() != node.targets.size())
      fail("line {}: cannot unpack {} values into {} names", node.line, values.size(),
           node.targets.size());
    for (size_t i = 0; i < values.size(); ++i) scopes_.back()[node.targets[i]] = values[i];
  }

  Flow render_for(const Node& node, std::string& out) {
    Value iterable = eval(*node.expr);
    List items;
    if (iterable.is_dict()) {
      for (const auto& entry : iterable.as_dict()) items.emplace_back(entry.first);
    } else if (iterable.is_list()) {
      items = iterable.as_list();
    } else if (iterable.is_string()) {
      const std::string& text = iterable.as_string();
      for (size_t i = 0; i < text.size();) {
        size_t length = 1;
        while (i + length < text.size() &&
               (static_cast<unsigned char>(text[i + length]) & 0xc0) == 0x80)
          ++length;
        items.emplace_back(text.substr(i, length));
        i += length;
      }
    } else if (!iterable.is_undefined() && !iterable.is_none()) {
      fail("line {}: '{}' object is not iterable", node.line, iterable.type_name());
    }
    scopes_.emplace_back();
    if (!node.conditions.empty()) {
      // {% for x in xs if cond %}: filter first, so loop.* counts the kept items.
      List kept;
      for (const Value& element : items) {
        bind_targets(node, element);
        if (eval(*node.conditions[0]).as_bool()) kept.push_back(element);
      }
      items = std::move(kept);
    }
    auto length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      bind_targets(node, items[static_cast<size_t>(i)]);
      Dict loop = {{"index", Value(i + 1)},
                   {"index0", Value(i)},
                   {"revindex", Value(length - i)},
                   {"revindex0", Value(length - i - 1)},
                   {"first", Value(i == 0)},
                   {"last", Value(i + 1 == length)},
                   {"length", Value(length)},
                   {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value()},
                   {"nextitem", i + 1 < length ? items[static_cast<size_t>(i + 1)] : Value()},
                   {"cycle", Value::function([i](CallArguments& args) -> Value {
                      if (args.positional.empty()) fail("loop.cycle() needs arguments");
                      return args.positional[static_cast<size_t>(i) % args.positional.size()];
                    })}};
      scopes_.back()["loop"] = Value(std::move(loop));
      if (render(node.branches[0], out) == Flow::kBreak) break;
    }
    scopes_.pop_back();
    if (length == 0 && node.branches.size() > 1) return render(node.branches[1], out);
    return Flow::kNormal;
  }

  void bind_targets(const Node& node, const Value& element) {
    if (node.targets.size() == 1) {
      scopes_.back()[node.targets[0]] = element;
      return;
    }
    if (!element.is_list() || element.as_list().size() != node.targets.size())
      fail("line {}: cannot unpack {} into {} names", node.line, element.type_name(),
           node.targets.size());
    for (size_t i = 0; i < node.targets.size(); ++i)
      scopes_.back()[node.targets[i]] = element.as_list()[i];
  }

  void define_macro(const Node& node) { scopes_.back()[node.targets[0]] = callable_body(node); }

  // A function that renders node.branches[0] with node.parameters bound: a macro, or the
  // caller() of a call block.
  Value callable_body(const Node& node) {
    const Node* macro = &node;
    return Value::function([this, macro](CallArguments& args) -> Value {
      if (++depth_ > limits_.max_depth)
        fail("line {}: macro calls nested deeper than {}", macro->line, limits_.max_depth);
      scopes_.emplace_back();
      for (size_t i = 0; i < macro->parameters.size(); ++i) {
        const auto& [name, fallback] = macro->parameters[i];
        Value value = args.get(i, name.c_str());
        if (value.is_undefined() && fallback) value = eval(*fallback);
        scopes_.back()[name] = value;
      }
      std::string body;
      render(macro->branches[0], body);
      scopes_.pop_back();
      --depth_;
      return Value(body);
    });
  }

  Value lookup(const std::string& name) {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      auto found = scope->find(name);
      if (found != scope->end()) return found->second;
    }
    Value builtin;
    if (global_function(name, builtin)) return builtin;
    return Value();
  }

  CallArguments arguments(const Expr& expr, size_t first) {
    CallArguments args;
    for (size_t i = first; i < expr.children.size(); ++i)
      args.positional.push_back(eval(*expr.children[i]));
    for (const auto& [name, value] : expr.keywords) args.keyword.emplace_back(name, eval(*value));
    return args;
  }

  Value attribute(const Value& object, const std::string& name, int line) {
    if (object.is_undefined()) fail("line {}: '{}' of an undefined value", line, name);
    if (object.is_dict()) {
      Value found = object.get(name);
      if (!found.is_undefined()) return found;
    }
    Value method;
    if (bound_method(object, name, method)) return method;
    return Value();
  }

  Value eval(const Expr& expr) {
    step(expr.line);
    switch (expr.type) {
      case Expr::Type::kLiteral:
        return expr.value;
      case Expr::Type::kName:
        return lookup(expr.name);
      case Expr::Type::kList:
      case Expr::Type::kTuple: {
        List items;
        for (const auto& child : expr.children) items.push_back(eval(*child));
        return Value(std::move(items));
      }
      case Expr::Type::kDict: {
        Dict entries;
        for (size_t i = 0; i + 1 < expr.children.size(); i += 2)
          entries.emplace_back(eval(*expr.children[i]).str(), eval(*expr.children[i + 1]));
        return Value(std::move(entries));
      }
      case Expr::Type::kAttribute:
        return attribute(eval(*expr.children[0]), expr.name, expr.line);
      case Expr::Type::kItem: {
        Value container = eval(*expr.children[0]);
        Value key = eval(*expr.children[1]);
        if (container.is_dict() && key.is_string()) {
          Value found = container.get(key.as_string());
          if (!found.is_undefined()) return found;
          Value method;
          if (bound_method(container, key.as_string(), method)) return method;
          return Value();
        }
        return item(container, key);
      }
      case Expr::Type::kSlice: {
        auto bound = [&](size_t index) {
          return expr.children[index] ? eval(*expr.children[index]) : Value();
        };
        return slice(eval(*expr.children[0]), bound(1), bound(2), bound(3));
      }
      case Expr::Type::kCall: {
        Value callee = eval(*expr.children[0]);
        if (!callee.is_callable())
          fail("line {}: {} is not callable", expr.line, callee.type_name());
        CallArguments args = arguments(expr, 1);
        return callee.as_function()(args);
      }
      case Expr::Type::kFilter: {
        Value input = eval(*expr.children[0]);
        CallArguments args = arguments(expr, 1);
        Value result;
        if (!apply_filter(expr.name, input, args, result))
          fail("line {}: no filter named '{}'", expr.line, expr.name);
        return result;
      }
      case Expr::Type::kTest: {
        Value input = eval(*expr.children[0]);
        CallArguments args = arguments(expr, 1);
        bool result = false;
        if (!apply_test(expr.name, input, args, result))
          fail("line {}: no test named '{}'", expr.line, expr.name);
        return Value(result != expr.negated);
      }
      case Expr::Type::kNot:
        return Value(!eval(*expr.children[0]).as_bool());
      case Expr::Type::kNegate: {
        Value value = eval(*expr.children[0]);
        if (value.kind() == Value::Kind::kInt) return Value(-value.as_int());
        if (value.kind() == Value::Kind::kFloat) return Value(-value.as_float());
        fail("line {}: bad operand type for unary -: {}", expr.line, value.type_name());
      }
      case Expr::Type::kConditional:
        return eval(*expr.children[0]).as_bool() ? eval(*expr.children[1])
                                                 : eval(*expr.children[2]);
      case Expr::Type::kBinary:
        return binary(expr);
    }
    return Value();
  }

  Value binary(const Expr& expr) {
    const std::string& op = expr.name;
    if (op == "and") {
      Value left = eval(*expr.children[0]);
      return left.as_bool() ? eval(*expr.children[1]) : left;
    }
    if (op == "or") {
      Value left = eval(*expr.children[0]);
      return left.as_bool() ? left : eval(*expr.children[1]);
    }
    Value left = eval(*expr.children[0]);
    Value right = eval(*expr.children[1]);
    if (op == "==") return Value(left.equals(right));
    if (op == "!=") return Value(!left.equals(right));
    if (op == "<") return Value(left.compare(right) < 0);
    if (op == ">") return Value(left.compare(right) > 0);
    if (op == "<=") return Value(left.compare(right) <= 0);
    if (op == ">=") return Value(left.compare(right) >= 0);
    if (op == "in") return Value(contains(right, left));
    if (op == "not in") return Value(!contains(right, left));
    if (op == "~") return Value(left.str() + right.str());
    return arithmetic(op, left, right, expr.line);
  }

  Value arithmetic(const std::string& op, const Value& left, const Value& right, int line) {
    if (op == "+" && left.is_string() && right.is_string())
      return Value(left.as_string() + right.as_string());
    if (op == "+" && left.is_list() && right.is_list()) {
      List joined = left.as_list();
      joined.insert(joined.end(), right.as_list().begin(), right.as_list().end());
      return Value(std::move(joined));
    }
    if (op == "*" && left.is_string() && right.kind() == Value::Kind::kInt) {
      std::string out;
      for (int64_t i = 0; i < right.as_int() && out.size() <= limits_.max_output_bytes; ++i)
        out += left.as_string();
      return Value(out);
    }
    bool numbers = (left.is_number() || left.kind() == Value::Kind::kBool) &&
                   (right.is_number() || right.kind() == Value::Kind::kBool);
    if (!numbers) {
      fail("line {}: unsupported operand types for {}: '{}' and '{}'", line, op, left.type_name(),
           right.type_name());
    }
    bool integers = left.kind() != Value::Kind::kFloat && right.kind() != Value::Kind::kFloat;
    if (op == "/") {
      if (right.as_float() == 0) fail("line {}: division by zero", line);
      return Value(left.as_float() / right.as_float());
    }
    if (op == "//" || op == "%") {
      if (right.as_float() == 0) fail("line {}: division by zero", line);
      if (integers) {
        int64_t a = left.as_int(), b = right.as_int();
        int64_t quotient = a / b - ((a % b != 0) && ((a < 0) != (b < 0)));
        return op == "//" ? Value(quotient) : Value(a - quotient * b);
      }
      double quotient = std::floor(left.as_float() / right.as_float());
      return op == "//" ? Value(quotient) : Value(left.as_float() - quotient * right.as_float());
    }
    if (integers) {
      int64_t a = left.as_int(), b = right.as_int();
      if (op == "+") return Value(a + b);
      if (op == "-") return Value(a - b);
      if (op == "*") return Value(a * b);
    }
    double a = left.as_float(), b = right.as_float();
    if (op == "+") return Value(a + b);
    if (op == "-") return Value(a - b);
    if (op == "*") return Value(a * b);
    fail("line {}: unsupported operator {}", line, op);
  }

  const RenderLimits& limits_;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  std::string output_;
  int64_t steps_ = 0;
  int depth_ = 0;
};

}  // namespace

struct ChatTemplate::Parsed {
  Body body;
};

ChatTemplate::ChatTemplate(const std::string& source) : parsed_(std::make_unique<Parsed>()) {
  parsed_->body = parse_template(source);
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const nlohmann::ordered_json& context,
                                 const RenderLimits& limits) const {
  try {
    Renderer renderer(limits, context);
    return renderer.run(parsed_->body);
  } catch (const Error& error) {
    std::string message = error.what();
    if (message.rfind("chat template", 0) == 0) throw;
    fail("chat template: {}", message);
  }
}

}  // namespace deepinfer::chat
