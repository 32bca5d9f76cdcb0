// errors.cpp - a moex failure as Python's moex.MoexError.
//
// A kernel that gets a status other than MOEX_OK throws MoexError below: a torch::PyTorchError,
// the exception type that torch's Python bindings turn into the Python exception its
// python_type() names, wherever the operator was called from (torch.ops.moex.*, the modules, or
// autograd's backward, whose engine carries the exception to the thread that called backward()).
// That type is moex._torch_ext.TorchMoexError, a subclass of moex.MoexError made from the message
// "<status name>: <moex_last_error>" (so .status and str() are the ctypes path's). If it cannot
// be imported the error is a RuntimeError with the same message. This is the only file that
// includes Python's headers.
#include <torch/csrc/Exceptions.h>

#include <string>

#include "moex_torch.h"

namespace moex_torch {
namespace {

struct MoexError : public torch::PyTorchError {
    using torch::PyTorchError::PyTorchError;

    // Called by torch's bindings with the GIL held.
    PyObject* python_type() override {
        static PyObject* type = nullptr;   // a reference kept for the process
        if (type == nullptr) {
            PyObject* module = PyImport_ImportModule("moex._torch_ext");
            if (module != nullptr) {
                type = PyObject_GetAttrString(module, "TorchMoexError");
                Py_DECREF(module);
            }
            if (type == nullptr) {
                PyErr_Clear();
                return PyExc_RuntimeError;
            }
        }
        return type;
    }
};

}  // namespace

void throw_moex_error(moex_status status, const char* message) {
    throw MoexError(std::string(moex_status_string(status)) + ": " + (message ? message : ""));
}

}  // namespace moex_torch
