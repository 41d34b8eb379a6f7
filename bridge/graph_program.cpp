// A compiled graph's program run in C++: the scheduled ATen calls of one FX
// graph as a list of instructions over value slots, each op called boxed
// through the dispatcher (so every dispatch key, Python modes included, sees
// it exactly as a call from Python would) without a Python frame, argument
// parsing or IValue conversion per op. Constants are converted once, when
// the program is built. Python's codegen.py builds it and keeps its own
// Python program for graphs this form does not express (callables other than
// ATen ops and the size arithmetic below, nested outputs).
//
// Graphs with symbolic sizes (torch.compile's dynamic shapes: a decoder's
// growing KV cache) carry their sizes as numbers: graph inputs, `sym_size`
// results and Python arithmetic on them (`past_len + seq`), which run here as
// number instructions: size_arithmetic.h's fast path where int64/double give
// exactly Python's result, the graph's Python function otherwise.
#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <utility>
#include <vector>

#include "fused_window.h"
#include "size_arithmetic.h"

namespace py = pybind11;

namespace vtpu::bridge {
namespace {

// How one argument of a call is produced at run time.
struct ArgSpec {
  // kNumberTensor: a number slot (a symbolic size) where the schema takes a
  // Tensor, wrapped as Python's argument parser would. kIntList: a size list
  // whose entries are slots (slot >= 0) or constants (`ints`).
  enum Kind { kSlot, kConstant, kTensorList, kOptionalTensorList, kNumberTensor, kIntList } kind = kConstant;
  int slot = -1;
  c10::IValue constant;
  std::vector<int> slots;  // list elements; -1 is None (optional lists) or a constant (int lists)
  std::vector<std::int64_t> ints;
  // kSlot: the parameter's type (an optional's element), for a slot that holds
  // a Python int beyond int64 (see raise_held_argument).
  c10::TypeKind param = c10::TypeKind::AnyType;
};

// An operand of a number instruction: a slot, or a constant (as an IValue
// for the fast path when it is a number, and as the Python object for the call).
struct NumberOperand {
  int slot = -1;
  c10::IValue number;
  py::object object;
};

struct Instruction {
  // kNumber: a Python function of numbers (size arithmetic and the like),
  // computed by size_arithmetic.h's fast path where it promises Python's
  // result (`fast`), else by calling `fn` (with the operands as one list when
  // `pack`: torch.sym_sum).
  enum Kind { kCall, kGetItem, kRelease, kEndChain, kNumber } kind = kCall;
  const c10::OperatorHandle* op = nullptr;
  std::size_t returns = 0;
  std::vector<ArgSpec> args;
  int out = -1;
  int src = -1;
  std::int64_t index = 0;
  bool fast = false;
  SizeOp size_op = SizeOp::kAdd;
  bool pack = false;
  std::vector<NumberOperand> numbers;
  py::object fn;
};

c10::TypePtr element_type(const c10::TypePtr& type) {
  c10::TypePtr t = type;
  if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
  if (auto list = t->cast<c10::ListType>()) return list->getElementType();
  return nullptr;
}

bool is_size_number(const c10::IValue& v) { return v.isInt() || v.isDouble() || v.isBool(); }

SizeNumber size_number(const c10::IValue& v) {
  if (v.isBool()) return SizeNumber::of_bool(v.toBool());
  if (v.isInt()) return SizeNumber::of_int(v.toInt());
  return SizeNumber::of_float(v.toDouble());
}

c10::IValue size_value(const SizeNumber& n) {
  switch (n.kind) {
    case SizeNumber::Kind::kBool: return n.i != 0;
    case SizeNumber::Kind::kFloat: return n.f;
    default: return n.i;
  }
}

// An int beyond int64 kept as its Python object inside an IValue (torch's own
// holder of that kind needs symbols libtorch_python does not export).
class PythonNumberHolder final : public c10::ivalue::PyObjectHolder {
 public:
  explicit PythonNumberHolder(py::object obj) : obj_(std::move(obj)) {}
  ~PythonNumberHolder() override {
    py::gil_scoped_acquire gil;
    obj_ = py::object();
  }
  PyObject* getPyObject() override { return obj_.ptr(); }
  c10::InferredType tryToInferType() override { return c10::InferredType(c10::NumberType::get()); }
  c10::IValue toIValue(const c10::TypePtr& type, std::optional<int32_t> = std::nullopt) override {
    throw std::invalid_argument("a Python int beyond int64 where " + type->str() + " is expected");
  }
  std::string toStr() override {
    py::gil_scoped_acquire gil;
    return py::str(obj_).cast<std::string>();
  }
  std::vector<at::Tensor> extractTensors() override { return {}; }

 private:
  py::object obj_;
};

c10::IValue held_python_number(const py::handle& obj) {
  return c10::IValue(c10::intrusive_ptr<c10::ivalue::PyObjectHolder>(
      c10::make_intrusive<PythonNumberHolder>(py::reinterpret_borrow<py::object>(obj))));
}

// A Python number (or None) as an IValue of its own kind; an int beyond int64
// (Python's ints grow) is kept as the Python object, which number
// instructions hand back to Python and outputs return as it is.
c10::IValue python_number(const py::handle& obj) {
  if (obj.is_none()) return c10::IValue();
  if (PyBool_Check(obj.ptr())) return obj.cast<bool>();
  if (PyLong_Check(obj.ptr())) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
    if (overflow == 0 && !(v == -1 && PyErr_Occurred())) return static_cast<std::int64_t>(v);
    PyErr_Clear();
    return held_python_number(obj);
  }
  if (PyFloat_Check(obj.ptr())) return obj.cast<double>();
  return held_python_number(obj);
}

bool is_int_list(const c10::TypePtr& type) {
  const c10::TypePtr element = element_type(type);
  return element && (element->kind() == c10::TypeKind::IntType || element->kind() == c10::TypeKind::SymIntType);
}

// `spec` from Python: ("slot", i) | ("const", value) | ("list", [i or None, ...])
// | ("number_tensor", i) | ("ilist", [("slot", i) or ("const", n), ...]).
ArgSpec parse_arg(const py::handle& spec, const c10::Argument& schema_arg) {
  const auto tuple = spec.cast<py::tuple>();
  const std::string kind = tuple[0].cast<std::string>();
  ArgSpec a;
  if (kind == "slot") {
    a.kind = ArgSpec::kSlot;
    a.slot = tuple[1].cast<int>();
    c10::TypePtr type = schema_arg.type();
    if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
    a.param = type->kind();
  } else if (kind == "number_tensor") {
    a.kind = ArgSpec::kNumberTensor;
    a.slot = tuple[1].cast<int>();
  } else if (kind == "ilist") {
    if (!is_int_list(schema_arg.type()))
      throw std::invalid_argument("a size list for argument " + schema_arg.name() + " of type " +
                                  schema_arg.type()->str());
    a.kind = ArgSpec::kIntList;
    for (const py::handle& e : tuple[1].cast<py::list>()) {
      const auto element = e.cast<py::tuple>();
      const bool slot = element[0].cast<std::string>() == "slot";
      if (!slot && !PyLong_Check(element[1].ptr()))
        throw std::invalid_argument("a size list entry that is not an int");
      a.slots.push_back(slot ? element[1].cast<int>() : -1);
      a.ints.push_back(slot ? 0 : element[1].cast<std::int64_t>());
    }
  } else if (kind == "const") {
    a.kind = ArgSpec::kConstant;
    const py::handle value = tuple[1];
    c10::TypePtr type = schema_arg.type();
    if (auto opt = type->cast<c10::OptionalType>()) type = opt->getElementType();
    const bool number = PyBool_Check(value.ptr()) || PyLong_Check(value.ptr()) || PyFloat_Check(value.ptr());
    if (number && type->kind() == c10::TypeKind::TensorType) {
      // A Python number where the schema takes a Tensor (add.Tensor(x, 1e-6)):
      // the wrapped-number tensor Python's argument parser would make.
      const c10::Scalar scalar = PyBool_Check(value.ptr())   ? c10::Scalar(value.cast<bool>())
                                 : PyLong_Check(value.ptr()) ? c10::Scalar(value.cast<std::int64_t>())
                                                             : c10::Scalar(value.cast<double>());
      at::Tensor wrapped = at::scalar_to_tensor(scalar);
      wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
      a.constant = std::move(wrapped);
    } else {
      a.constant = torch::jit::toIValue(value, schema_arg.type());
    }
  } else if (kind == "list") {
    const c10::TypePtr element = element_type(schema_arg.type());
    if (!element) throw std::invalid_argument("a list of values for a non-list argument " + schema_arg.name());
    if (element->kind() == c10::TypeKind::TensorType) {
      a.kind = ArgSpec::kTensorList;
    } else if (auto opt = element->cast<c10::OptionalType>();
               opt && opt->getElementType()->kind() == c10::TypeKind::TensorType) {
      a.kind = ArgSpec::kOptionalTensorList;
    } else {
      throw std::invalid_argument("a list of values for argument " + schema_arg.name() + " of type " +
                                  schema_arg.type()->str());
    }
    for (const py::handle& e : tuple[1].cast<py::list>()) a.slots.push_back(e.is_none() ? -1 : e.cast<int>());
    if (a.kind == ArgSpec::kTensorList)
      for (int s : a.slots)
        if (s < 0) throw std::invalid_argument("None in a tensor list");
  } else {
    throw std::invalid_argument("unknown argument kind " + kind);
  }
  return a;
}

class GraphProgram {
 public:
  // `instructions`: ("call", "aten::name", "overload", [positional specs],
  // {keyword: spec}, out_slot) | ("getitem", src, index, out) | ("release", slot)
  // | ("end_chain",): fused mode's chain boundary (fused_window.h).
  // `outputs`: a slot per output, or ("const", value) for an output the
  // graph returns as a constant (None included).
  GraphProgram(int slots, int inputs, const py::list& instructions, const py::list& outputs)
      : slot_count_(static_cast<std::size_t>(slots)), inputs_(inputs) {
    for (const py::handle& o : outputs) {
      if (PyLong_Check(o.ptr())) {
        outputs_.push_back(o.cast<int>());
        output_constants_.push_back(py::none());
      } else {
        outputs_.push_back(-1);
        output_constants_.push_back(py::reinterpret_borrow<py::object>(o.cast<py::tuple>()[1]));
      }
    }
    for (const py::handle& item : instructions) {
      const auto t = item.cast<py::tuple>();
      const std::string kind = t[0].cast<std::string>();
      Instruction ins;
      if (kind == "call") {
        ins.kind = Instruction::kCall;
        const auto handle = c10::Dispatcher::singleton().findSchema(
            {t[1].cast<std::string>(), t[2].cast<std::string>()});
        if (!handle) throw std::invalid_argument("no operator " + t[1].cast<std::string>());
        ops_.push_back(*handle);
        const auto& schema = handle->schema();
        const auto positional = t[3].cast<py::list>();
        const auto keywords = t[4].cast<py::dict>();
        const auto& arguments = schema.arguments();
        if (positional.size() > arguments.size()) throw std::invalid_argument("too many arguments");
        for (std::size_t i = 0; i < arguments.size(); ++i) {
          const c10::Argument& arg = arguments[i];
          if (i < positional.size()) {
            ins.args.push_back(parse_arg(positional[i], arg));
          } else if (keywords.contains(arg.name().c_str())) {
            ins.args.push_back(parse_arg(keywords[arg.name().c_str()], arg));
          } else if (arg.default_value()) {
            ArgSpec a;
            a.constant = *arg.default_value();
            ins.args.push_back(std::move(a));
          } else {
            throw std::invalid_argument("argument " + arg.name() + " missing");
          }
        }
        ins.returns = schema.returns().size();
        ins.out = t[5].cast<int>();
      } else if (kind == "getitem") {
        ins.kind = Instruction::kGetItem;
        ins.src = t[1].cast<int>();
        ins.index = t[2].cast<std::int64_t>();
        ins.out = t[3].cast<int>();
      } else if (kind == "release") {
        ins.kind = Instruction::kRelease;
        ins.src = t[1].cast<int>();
      } else if (kind == "end_chain") {
        ins.kind = Instruction::kEndChain;
      } else if (kind == "number") {
        // ("number", fast op name or "", [("slot", i) | ("const", value)], out, fn, pack)
        ins.kind = Instruction::kNumber;
        const std::string name = t[1].cast<std::string>();
        ins.fast = !name.empty();
        if (ins.fast) ins.size_op = parse_size_op(name);
        for (const py::handle& operand : t[2].cast<py::list>()) {
          const auto spec = operand.cast<py::tuple>();
          NumberOperand a;
          if (spec[0].cast<std::string>() == "slot") {
            a.slot = spec[1].cast<int>();
          } else {
            a.object = py::reinterpret_borrow<py::object>(spec[1]);
            a.number = python_number(spec[1]);
          }
          ins.numbers.push_back(std::move(a));
        }
        ins.out = t[3].cast<int>();
        ins.fn = py::reinterpret_borrow<py::object>(t[4]);
        ins.pack = t[5].cast<bool>();
        if (!PyCallable_Check(ins.fn.ptr())) throw std::invalid_argument("a number instruction without a function");
      } else {
        throw std::invalid_argument("unknown instruction " + kind);
      }
      instructions_.push_back(std::move(ins));
    }
    // Operator handles live in a vector that no longer grows: point at them.
    std::size_t next = 0;
    for (Instruction& ins : instructions_)
      if (ins.kind == Instruction::kCall) ins.op = &ops_[next++];
  }

  // AOTAutograd's boxed convention: the graph owns its inputs, so `args` is
  // emptied and each input dies at its last use inside the program.
  py::object run(py::list args) {
    if (static_cast<int>(args.size()) != inputs_)
      throw std::invalid_argument("compiled graph expects " + std::to_string(inputs_) + " inputs, got " +
                                  std::to_string(args.size()));
    std::vector<c10::IValue> values(slot_count_);
    for (int i = 0; i < inputs_; ++i) values[static_cast<std::size_t>(i)] = input_value(args[i]);
    PyList_SetSlice(args.ptr(), 0, PyList_Size(args.ptr()), nullptr);
    torch::jit::Stack stack;
    for (const Instruction& ins : instructions_) {
      switch (ins.kind) {
        case Instruction::kCall: {
          stack.clear();
          stack.reserve(ins.args.size());
          for (const ArgSpec& a : ins.args) push_arg(stack, a, values);
          ins.op->callBoxed(stack);
          if (ins.returns == 1) {
            values[static_cast<std::size_t>(ins.out)] = std::move(stack[0]);
          } else if (ins.returns > 1) {
            values[static_cast<std::size_t>(ins.out)] = c10::ivalue::Tuple::create(std::move(stack));
          }
          break;
        }
        case Instruction::kGetItem: {
          const c10::IValue& src = values[static_cast<std::size_t>(ins.src)];
          c10::IValue element;
          if (src.isTuple()) element = src.toTupleRef().elements().at(static_cast<std::size_t>(ins.index));
          else if (src.isTensorList()) element = src.toTensorList().get(static_cast<std::size_t>(ins.index));
          else if (src.isList()) element = src.toList().get(static_cast<std::size_t>(ins.index));
          else throw std::invalid_argument("getitem of a value that is not a tuple or list");
          values[static_cast<std::size_t>(ins.out)] = std::move(element);
          break;
        }
        case Instruction::kRelease:
          values[static_cast<std::size_t>(ins.src)] = c10::IValue();
          break;
        case Instruction::kEndChain:
          end_fused_chain();
          break;
        case Instruction::kNumber:
          values[static_cast<std::size_t>(ins.out)] = run_number(ins, values);
          break;
      }
    }
    // Copied, not moved: AOTAutograd's graphs return one value twice (a
    // gradient shared by two inputs, a user output also saved for backward).
    py::list out;
    for (std::size_t i = 0; i < outputs_.size(); ++i) {
      const int slot = outputs_[i];
      if (slot >= 0) out.append(torch::jit::toPyObject(values[static_cast<std::size_t>(slot)]));
      else out.append(output_constants_[i]);
    }
    return out;
  }

 private:
  // A graph input: a tensor, or a Python number (a size Dynamo made symbolic,
  // a scalar argument), or None.
  static c10::IValue input_value(const py::handle& obj) {
    if (THPVariable_Check(obj.ptr())) return THPVariable_Unpack(obj.ptr());
    if (obj.is_none()) return c10::IValue();
    if (PyBool_Check(obj.ptr()) || PyLong_Check(obj.ptr()) || PyFloat_Check(obj.ptr())) return python_number(obj);
    throw std::invalid_argument(std::string("compiled graph input of type ") + Py_TYPE(obj.ptr())->tp_name);
  }

  // Python's OverflowError, raised through the program's error handler.
  [[noreturn]] static void raise_overflow(const char* message) {
    py::gil_scoped_acquire gil;
    PyErr_SetString(PyExc_OverflowError, message);
    throw python_error();
  }

  // A Python int beyond int64 (a held number) where an op takes a number
  // raises what Python's argument parser raises in eager mode: OverflowError
  // for a Scalar or Tensor parameter, ValueError for an int, TypeError in a
  // size list (it raised "IValue is not a Scalar"). A float parameter would
  // take it as a float in eager mode; Dynamo refuses to trace that call.
  [[noreturn]] static void raise_held_argument(c10::TypeKind param) {
    TORCH_CHECK_VALUE(param != c10::TypeKind::IntType && param != c10::TypeKind::SymIntType,
                      "Overflow when unpacking long long");
    raise_overflow("int too big to convert");
  }

  static void push_arg(torch::jit::Stack& stack, const ArgSpec& a, const std::vector<c10::IValue>& values) {
    switch (a.kind) {
      case ArgSpec::kSlot: {
        const c10::IValue& v = values[static_cast<std::size_t>(a.slot)];
        if (v.isPyObject()) raise_held_argument(a.param);
        stack.push_back(v);
        break;
      }
      case ArgSpec::kConstant: stack.push_back(a.constant); break;
      case ArgSpec::kTensorList: {
        c10::List<at::Tensor> list;
        list.reserve(a.slots.size());
        for (int s : a.slots) list.push_back(values[static_cast<std::size_t>(s)].toTensor());
        stack.emplace_back(std::move(list));
        break;
      }
      case ArgSpec::kNumberTensor: {
        const c10::IValue& v = values[static_cast<std::size_t>(a.slot)];
        if (v.isPyObject()) raise_overflow("int too big to convert");
        at::Tensor wrapped = at::scalar_to_tensor(v.toScalar());
        wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
        stack.emplace_back(std::move(wrapped));
        break;
      }
      case ArgSpec::kIntList: {
        c10::List<std::int64_t> list;
        list.reserve(a.slots.size());
        for (std::size_t i = 0; i < a.slots.size(); ++i) {
          if (a.slots[i] < 0) {
            list.push_back(a.ints[i]);
            continue;
          }
          const c10::IValue& v = values[static_cast<std::size_t>(a.slots[i])];
          TORCH_CHECK_TYPE(!v.isPyObject(), "a size beyond int64: Overflow when unpacking long long");
          list.push_back(v.toInt());
        }
        stack.emplace_back(std::move(list));
        break;
      }
      case ArgSpec::kOptionalTensorList: {
        c10::List<std::optional<at::Tensor>> list;
        list.reserve(a.slots.size());
        for (int s : a.slots)
          list.push_back(s < 0 ? std::optional<at::Tensor>() : values[static_cast<std::size_t>(s)].toTensor());
        stack.emplace_back(std::move(list));
        break;
      }
    }
  }

  static const c10::IValue& number_at(const NumberOperand& a, const std::vector<c10::IValue>& values) {
    return a.slot >= 0 ? values[static_cast<std::size_t>(a.slot)] : a.number;
  }

  // The fast path where it promises Python's result, else the Python function
  // itself (which also raises what Python raises: ZeroDivisionError, ...).
  static c10::IValue run_number(const Instruction& ins, const std::vector<c10::IValue>& values) {
    if (ins.fast) {
      c10::SmallVector<SizeNumber, 4> numbers;
      bool plain = true;
      for (const NumberOperand& a : ins.numbers) {
        const c10::IValue& v = number_at(a, values);
        if (!is_size_number(v)) {
          plain = false;
          break;
        }
        numbers.push_back(size_number(v));
      }
      if (plain)
        if (const auto result = apply_size_op(ins.size_op, numbers.data(), numbers.size())) return size_value(*result);
    }
    py::tuple args(ins.numbers.size());
    for (std::size_t i = 0; i < ins.numbers.size(); ++i) {
      const NumberOperand& a = ins.numbers[i];
      args[i] = a.slot >= 0 ? torch::jit::toPyObject(values[static_cast<std::size_t>(a.slot)]) : a.object;
    }
    const py::object result = ins.pack ? ins.fn(py::list(args)) : ins.fn(*args);
    return python_number(result);
  }

  std::size_t slot_count_;
  int inputs_;
  std::vector<int> outputs_;        // a slot, or -1: the constant in output_constants_
  std::vector<py::object> output_constants_;
  std::vector<c10::OperatorHandle> ops_;
  std::vector<Instruction> instructions_;
};

}  // namespace

void register_graph_program(py::module& m) {
  py::class_<GraphProgram>(m, "_GraphProgram")
      .def(py::init([](int slots, int inputs, const py::list& instructions, const py::list& outputs) {
             try {
               return new GraphProgram(slots, inputs, instructions, outputs);
             } catch (const std::invalid_argument& e) {
               throw py::value_error(std::string("vtpu graph program: ") + e.what());
             }
           }),
           py::arg("slots"), py::arg("inputs"), py::arg("instructions"), py::arg("outputs"))
      .def("__call__", [](GraphProgram& self, py::list args) -> py::object {
        HANDLE_TH_ERRORS
        return self.run(std::move(args));
        END_HANDLE_TH_ERRORS_PYBIND
      });
}

}  // namespace vtpu::bridge
