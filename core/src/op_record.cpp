// An operation recorder over libtorch's RecordFunction callbacks, which tch does not
// expose: while it records, every operator the calling thread dispatches (top-level and
// nested, at the FUNCTION scope) is written down with its depth, its name and its
// arguments: a tensor as its dtype, shape and device (not its address, nor its values
// except a wrapped host number's, which a kernel takes by value), every other argument
// by value (floats to the last bit), lists element by element. Two updates that record the
// same text dispatch the same operators with the same host-side arguments, what a CUDA
// graph replays. Operators other threads dispatch are not recorded. On the CPU autograd
// runs a backward pass on the calling thread, so the convolutional torso's and the IQN
// head's (the parts of the update that use autograd) are in the recording; on a GPU
// autograd runs them on its device threads, where they are not. Every entry point
// catches what libtorch throws and returns it as text.
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <string>

namespace {

struct Recording {
  at::CallbackHandle handle = at::INVALID_CALLBACK_HANDLE;
  int depth = 0;
  std::string text;
};

// One recording per thread: the callbacks are the thread's own.
thread_local Recording* recording = nullptr;

int fail(const char* what, char* err, size_t len) {
  std::snprintf(err, len, "%s", what);
  return 1;
}

void describe_double(std::ostringstream& os, double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  os << buf;
}

void describe(std::ostringstream& os, const c10::IValue& v);

// A 0-dim CPU tensor's value, read in place (dispatching `item` here would record
// itself); false for a dtype it does not read.
bool describe_value(std::ostringstream& os, const at::Tensor& t) {
  const void* p = t.unsafeGetTensorImpl()->data();
  switch (t.scalar_type()) {
    case at::kDouble:
      describe_double(os, *static_cast<const double*>(p));
      return true;
    case at::kFloat:
      describe_double(os, *static_cast<const float*>(p));
      return true;
    case at::kLong:
      os << *static_cast<const int64_t*>(p);
      return true;
    case at::kInt:
      os << *static_cast<const int32_t*>(p);
      return true;
    case at::kBool:
      os << *static_cast<const bool*>(p);
      return true;
    default:
      return false;
  }
}

void describe_tensor(std::ostringstream& os, const at::Tensor& t) {
  if (!t.defined()) {
    os << "T()";
    return;
  }
  os << "T(" << t.scalar_type() << ",[";
  const auto sizes = t.sizes();
  for (size_t i = 0; i < sizes.size(); ++i) {
    os << (i ? "," : "") << sizes[i];
  }
  os << "]," << t.device();
  // A host number libtorch wrapped to pass as a tensor (`x * 0.5`) is an argument
  // like a scalar's: a device kernel takes it by value, and a graph would replay the
  // value it recorded. (Other 0-dim tensors are data: an output's value before the
  // operator runs means nothing.)
  if (t.is_cpu() && t.unsafeGetTensorImpl()->is_wrapped_number()) {
    os << ",wrapped=";
    if (!describe_value(os, t)) {
      os << "?";
    }
  }
  os << ")";
}

void describe_list(std::ostringstream& os, c10::ArrayRef<c10::IValue> items) {
  os << "[";
  for (size_t i = 0; i < items.size(); ++i) {
    os << (i ? "," : "");
    describe(os, items[i]);
  }
  os << "]";
}

void describe(std::ostringstream& os, const c10::IValue& v) {
  if (v.isTensor()) {
    describe_tensor(os, v.toTensor());
  } else if (v.isDouble()) {
    describe_double(os, v.toDouble());
  } else if (v.isList()) {
    // Tensor, int, float and optional-tensor lists alike: each element described.
    describe_list(os, v.toListRef());
  } else if (v.isTuple()) {
    describe_list(os, v.toTupleRef().elements());
  } else if (v.isGenericDict() || v.isObject()) {
    os << v.tagKind();
  } else {
    os << v;
  }
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  Recording* r = recording;
  if (r == nullptr) {
    return nullptr;
  }
  const int depth = r->depth;
  // Counted before anything can throw: on_end runs either way.
  r->depth += 1;
  std::ostringstream os;
  os << depth << ' ' << fn.name() << '(';
  try {
    const auto inputs = fn.inputs();
    for (size_t i = 0; i < inputs.size(); ++i) {
      os << (i ? ", " : "");
      describe(os, inputs[i]);
    }
  } catch (const std::exception& e) {
    os << "<not described: " << e.what() << ">";
  }
  os << ")\n";
  r->text += os.str();
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {
  if (recording != nullptr && recording->depth > 0) {
    recording->depth -= 1;
  }
}

}  // namespace

extern "C" {

int millrace_op_record_start(char* err, size_t len) {
  if (recording != nullptr) {
    return fail("this thread is already recording", err, len);
  }
  try {
    auto* r = new Recording();
    recording = r;
    r->handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback(on_start, on_end)
            .needsInputs(true)
            .scopes({at::RecordScope::FUNCTION}));
    return 0;
  } catch (const std::exception& e) {
    delete recording;
    recording = nullptr;
    return fail(e.what(), err, len);
  }
}

// Stops this thread's recording; `*out` is its text (one line an operator, malloc'd:
// free it with millrace_op_record_free).
int millrace_op_record_stop(char** out, char* err, size_t len) {
  Recording* r = recording;
  if (r == nullptr) {
    return fail("this thread is not recording", err, len);
  }
  try {
    at::removeCallback(r->handle);
  } catch (const std::exception& e) {
    recording = nullptr;
    delete r;
    return fail(e.what(), err, len);
  }
  recording = nullptr;
  char* text = static_cast<char*>(std::malloc(r->text.size() + 1));
  if (text == nullptr) {
    delete r;
    return fail("out of memory copying the recording", err, len);
  }
  std::memcpy(text, r->text.c_str(), r->text.size() + 1);
  delete r;
  *out = text;
  return 0;
}

void millrace_op_record_free(char* text) { std::free(text); }

}  // extern "C"
