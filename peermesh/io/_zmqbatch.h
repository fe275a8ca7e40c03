/*
 * What the parts of peermesh.io._zmqbatch share: libzmq's send as load() found it, the
 * error it raises, interned names, the checks of a fast path's arguments, and the slots of
 * classes read, set and filled in place. _zmqbatch.c is the module (loading libzmq,
 * batched reads and sends); _zmqbatch_shared.c holds the helpers declared here for the
 * fast paths; each protocol's fast path over a read batch has a file of its own:
 * _zmqbatch_zre.c, _zmqbatch_sada.c, _zmqbatch_flux.c.
 */
#ifndef PEERMESH_ZMQBATCH_H
#define PEERMESH_ZMQBATCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <string.h>

#define ZMQ_DONTWAIT 1
#define ZMQ_SNDMORE 2

/* libzmq's zmq_send and zmq_errno, set by load() */
extern int (*zmq_send_)(void *, const void *, size_t, int);
extern int (*zmq_errno_)(void);
/* load() has succeeded */
extern int loaded;
/* Raise zmq.ZMQError(code); returns NULL. */
PyObject *raise_errno(int code);

/* In a function returning int: var = the interned str text, or return -1. */
#define INTERN(var, text)                                                        \
    if (!(var = PyUnicode_InternFromString(text)))                               \
        return -1;

/* Where the slots of a plain class with __slots__ only (no __dict__, no base but object)
 * live in an instance, found once per class: the class must declare exactly count
 * __slots__, names among them. */
#define MAX_SLOTS 16
typedef struct {
    PyTypeObject *cls;
    int count;
    const char *const *names;
    Py_ssize_t offsets[MAX_SLOTS];
} slot_layout;

/* Where attribute name (a str) of cls lives in an instance when it is an object slot;
 * 0 when it is not one (no exception). */
Py_ssize_t slot_offset(PyTypeObject *cls, PyObject *name);
/* Find the layout's offsets in class cls (once per class): 0, or -1 with TypeError. */
int layout_for(slot_layout *layout, PyObject *cls);
/* A new instance of the layout's class, its slots set to values (in the layout's order;
 * each gets a reference), __init__ not run. */
PyObject *layout_new(slot_layout *layout, PyObject *const *values);
/* Slot i of obj, an instance of the layout's class (borrowed; NULL when unset). */
#define SLOT(obj, layout, i) (*(PyObject **)((char *)(obj) + (layout).offsets[i]))
/* Slot i of obj set to value, a new reference it takes (NULL: nothing done, -1). */
int set_slot(PyObject *obj, slot_layout *layout, int i, PyObject *value);
/* Is obj of the layout's class (found now if it is another)? 1, or 0 (no exception). */
int of_layout(PyObject *obj, slot_layout *layout);

/* A fast path's start (its second argument, an index into its batch) into *at: 0, or -1
 * with TypeError (not an int) or ValueError (negative). */
int batch_start(PyObject *start, Py_ssize_t *at);
/* Is shape a tuple of n items? 1, or 0 with TypeError "shape is <what>". */
int shape_of(PyObject *shape, Py_ssize_t n, const char *what);

/* A docstring the module's method table (in _zmqbatch.c) refers to from another file. */
#define SHARED_DOC(name, text) const char name[] = PyDoc_STR(text)

/* The protocols' fast paths (METH_FASTCALL) and their docstrings. */
#define FAST_PATH(name)                                                          \
    PyObject *name(PyObject *self, PyObject *const *args, Py_ssize_t nargs);     \
    extern const char name##_doc[];
FAST_PATH(zre_take)
FAST_PATH(sada_take)
FAST_PATH(sada_submit)
FAST_PATH(sada_jobs)
FAST_PATH(flux_take)
#undef FAST_PATH

#endif
