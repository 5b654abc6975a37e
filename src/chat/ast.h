// Parsed chat templates: expressions and statements. Internal to the chat module.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "chat/value.h"

namespace deepinfer::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Type {
    kLiteral,      // value
    kName,         // name
    kList,         // children
    kTuple,        // children
    kDict,         // children: key, value, key, value...
    kAttribute,    // children[0].name
    kItem,         // children[0][children[1]]
    kSlice,        // children[0][children[1]:children[2]:children[3]] (null = omitted)
    kCall,         // children[0](children[1..], keywords)
    kFilter,       // children[0] | name(children[1..], keywords)
    kTest,         // children[0] is [not] name(children[1..])
    kNot,          // not children[0]
    kNegate,       // -children[0]
    kBinary,       // children[0] op children[1]
    kConditional,  // children[1] if children[0] else children[2]
  };
  Type type;
  Value value;
  std::string name;  // variable, attribute, filter, test or operator
  bool negated = false;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  int line = 0;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Type {
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kCallBlock,
    kFilterBlock,
    kBreak,
    kContinue
  };
  Type type;
  int line = 0;
  std::string text;                  // kText
  ExprPtr expr;                      // kOutput value, kFor iterable, kSet value
  std::vector<ExprPtr> conditions;   // kIf: one per branch; kFor: optional filter in [0]
  std::vector<Body> branches;        // kIf: one per condition (+ else); kFor: body (+ else)
  std::vector<std::string> targets;  // kFor loop variables, kSet/kSetBlock name(s)
  std::string attribute;             // kSet: ns.attribute = ...
  // kMacro: parameters with optional defaults; body in branches[0]. kCallBlock: the caller's
  // parameters, the call in `expr`, the body caller() renders in branches[0].
  std::vector<std::pair<std::string, ExprPtr>> parameters;
  ExprPtr filter;  // kFilterBlock / kSetBlock: filter applied to the body
};

// The variable a filter block's (or set block's) rendered body is bound to.
constexpr const char* kBlockBody = "\x01body";

// Parses template source; Error names the line on a syntax error.
Body parse_template(const std::string& source);

}  // namespace deepinfer::chat
