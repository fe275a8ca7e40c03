/*
 * peermesh.io._zmqbatch: receive a batch of ZeroMQ messages, send one
 * message's frames (or several messages, or one whose first frame is numbered in the
 * call), or ask a socket's ZMQ_EVENTS, in one call from Python.
 *
 * pyzmq spends about 0.6 us of Python per frame (a call, a Frame object, the
 * "more" flag); a ZRE WHISPER is three frames at a ROUTER. This module calls
 * the libzmq that pyzmq has loaded (its functions are looked up by name
 * through pyzmq's own extension, see load()), on the raw socket handle that
 * pyzmq exposes as Socket.underlying. Calls never block (ZMQ_DONTWAIT) and
 * hold the GIL; the caller must not pass the handle of a closed socket.
 *
 * This file is the module: loading libzmq, batched reads and sends, the method table.
 * Each protocol's fast path over a read batch is a file of its own (_zmqbatch_zre.c,
 * _zmqbatch_sada.c, _zmqbatch_flux.c); _zmqbatch.h is what they share, and
 * _zmqbatch_shared.c the helpers it declares for them.
 */
#include "_zmqbatch.h"
#include <dlfcn.h>

#define ZMQ_EVENTS 15
#define ZMQ_SRCFD 2
/* The pseudo-property that reads a message's "User-Id", the descriptor of the
 * connection it came by (ZMQ_SRCFD) and its "Peer-Address" together, as
 * (str or None, int, str or None). */
#define KEY_AND_FD "User-Id+fd"

/* zmq_msg_t as libzmq 4 declares it: 64 opaque bytes, pointer-aligned. */
typedef struct {
    unsigned char _[64];
} __attribute__((aligned(sizeof(void *)))) zmq_msg;

static int (*msg_init)(zmq_msg *);
static int (*msg_recv)(zmq_msg *, void *, int);
static int (*msg_close)(zmq_msg *);
static void *(*msg_data)(zmq_msg *);
static size_t (*msg_size)(const zmq_msg *);
static int (*msg_more)(const zmq_msg *);
static const char *(*msg_gets)(const zmq_msg *, const char *);
static int (*msg_get)(const zmq_msg *, int);
int (*zmq_send_)(void *, const void *, size_t, int);
static int (*zmq_getsockopt_)(void *, int, void *, size_t *);
int (*zmq_errno_)(void);
static void (*zmq_version_)(int *, int *, int *);

static PyObject *error_class; /* zmq.ZMQError, called with an errno */
int loaded;

PyObject *
raise_errno(int code)
{
    PyObject *exc = PyObject_CallFunction(error_class, "i", code);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

static void *
handle_of(PyObject *arg)
{
    if (!loaded) {
        PyErr_SetString(PyExc_RuntimeError, "call load() first");
        return NULL;
    }
    void *sock = PyLong_AsVoidPtr(arg);
    if (!sock && !PyErr_Occurred())
        raise_errno(ENOTSOCK); /* a closed link passes 0 */
    return sock;
}

PyDoc_STRVAR(load_doc,
"load(library_path, error_class)\n\n"
"Look up libzmq's functions through the shared object at library_path (pyzmq's\n"
"extension, which links libzmq) and raise error_class(errno) on ZeroMQ errors.\n"
"Raises ImportError if a function is missing or libzmq is older than 4.");

static PyObject *
load(PyObject *self, PyObject *args)
{
    const char *path;
    PyObject *cls;
    if (!PyArg_ParseTuple(args, "sO:load", &path, &cls))
        return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        lib = dlopen(path, RTLD_NOW);
    if (!lib)
        return PyErr_Format(PyExc_ImportError, "cannot open %s: %s", path, dlerror());
#define FIND(var, name)                                                          \
    if (!(*(void **)&var = dlsym(lib, name)))                                    \
        return PyErr_Format(PyExc_ImportError, "%s not found through %s", name, path);
    FIND(msg_init, "zmq_msg_init");
    FIND(msg_recv, "zmq_msg_recv");
    FIND(msg_close, "zmq_msg_close");
    FIND(msg_data, "zmq_msg_data");
    FIND(msg_size, "zmq_msg_size");
    FIND(msg_more, "zmq_msg_more");
    FIND(msg_gets, "zmq_msg_gets");
    FIND(msg_get, "zmq_msg_get");
    FIND(zmq_send_, "zmq_send");
    FIND(zmq_getsockopt_, "zmq_getsockopt");
    FIND(zmq_errno_, "zmq_errno");
    FIND(zmq_version_, "zmq_version");
#undef FIND
    int major, minor, patch;
    zmq_version_(&major, &minor, &patch);
    if (major < 4)
        return PyErr_Format(PyExc_ImportError, "libzmq %d.%d is older than 4", major, minor);
    Py_INCREF(cls);
    Py_XSETREF(error_class, cls);
    loaded = 1;
    Py_RETURN_NONE;
}

/* A message property (such as "Peer-Address") of a received frame: str, or None;
 * for KEY_AND_FD, (its "User-Id", the descriptor it came by, its "Peer-Address"). */
static PyObject *
property_of(zmq_msg *msg, const char *name)
{
    if (name[0] == 'U' && strcmp(name, KEY_AND_FD) == 0) {
        PyObject *key = property_of(msg, "User-Id");
        PyObject *address = key ? property_of(msg, "Peer-Address") : NULL;
        PyObject *value = address ? Py_BuildValue("(OiO)", key, msg_get(msg, ZMQ_SRCFD),
                                                  address) : NULL;
        Py_XDECREF(key);
        Py_XDECREF(address);
        return value;
    }
    const char *value = msg_gets(msg, name);
    if (!value)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(value, (Py_ssize_t)strlen(value), "replace");
}

/* A new reference to the bytes object of `known` (a tuple of bytes, or NULL) whose octets
 * are `size` at `data`, or NULL when none is. */
static PyObject *
known_frame(PyObject *known, const char *data, size_t size)
{
    Py_ssize_t n = known ? PyTuple_GET_SIZE(known) : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *frame = PyTuple_GET_ITEM(known, i);
        if ((size_t)PyBytes_GET_SIZE(frame) == size
            && memcmp(PyBytes_AS_STRING(frame), data, size) == 0) {
            Py_INCREF(frame);
            return frame;
        }
    }
    return NULL;
}

/* The rest of a message whose first frame was read: its frames, or None when
 * they add up to more than `room` bytes or more than `max_frames` frames (they
 * are read and dropped). With `name`, *value gets that property of the last frame;
 * with `fd`, *fd gets the descriptor the last frame came by. A frame equal to one of
 * `known` (a tuple of bytes, or NULL) is that object. */
static PyObject *
recv_rest(void *sock, int more, Py_ssize_t room, Py_ssize_t max_frames, const char *name,
          PyObject **value, int *fd, PyObject *known, size_t known_max)
{
    PyObject *frames = PyList_New(0);
    int fits = 1;
    zmq_msg msg;
    while (more) {
        msg_init(&msg);
        if (msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0) { /* cannot happen: parts arrive whole */
            msg_close(&msg);
            break;
        }
        size_t size = msg_size(&msg);
        more = msg_more(&msg);
        room -= (Py_ssize_t)size;
        if (room < 0 || (frames && PyList_GET_SIZE(frames) >= max_frames))
            fits = 0;
        if (fits && frames) {
            PyObject *data = size <= known_max ? known_frame(known, msg_data(&msg), size)
                                               : NULL;
            if (!data)
                data = PyBytes_FromStringAndSize(msg_data(&msg), (Py_ssize_t)size);
            if (!data || PyList_Append(frames, data) < 0)
                Py_CLEAR(frames);
            Py_XDECREF(data);
        }
        if (!more && name && !*value)
            *value = property_of(&msg, name);
        if (!more && fd)
            *fd = msg_get(&msg, ZMQ_SRCFD);
        msg_close(&msg);
    }
    if (frames && !fits) {
        Py_DECREF(frames);
        Py_RETURN_NONE;
    }
    return frames;
}

/* routes[fd] = first, unless it holds an equal routing id already; -1 on error. */
static int
note_route(PyObject *routes, int fd, PyObject *first)
{
    PyObject *key = PyLong_FromLong(fd);
    if (!key)
        return -1;
    PyObject *known = PyDict_GetItemWithError(routes, key); /* borrowed */
    int same = known ? PyObject_RichCompareBool(known, first, Py_EQ) : 0;
    int result = same < 0 || (!known && PyErr_Occurred()) ? -1
                 : same ? 0 : PyDict_SetItem(routes, key, first);
    Py_DECREF(key);
    return result;
}

PyDoc_STRVAR(recv_batch_doc,
"recv_batch(handle, count, limit, max_frames=-1, name=None, routes=None, known=None)\n"
"-> list\n\n"
"Read up to count messages without waiting: each as (first, rest), its first\n"
"frame (bytes; a ROUTER's routing id) and a list of the other frames, or None\n"
"instead of the list when those add up to more than limit bytes or more than\n"
"max_frames frames (-1: any number). With name, each is (first, rest, value),\n"
"value being that message property of the last frame (e.g. \"Peer-Address\"),\n"
"str or None (for \"User-Id+fd\": the tuple (User-Id, the descriptor the message\n"
"came by, Peer-Address)). With routes (a dict), each message's first frame is\n"
"stored in it under the descriptor of the connection the message came by. With\n"
"known (a tuple of bytes), a frame after the first equal to one of them is that\n"
"very object (frames every message has, such as a protocol's name, made once).\n"
"Fewer than count means the socket is empty (and its descriptor's edge re-armed).");

static PyObject *
recv_batch(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 3 || nargs > 7)
        return PyErr_Format(PyExc_TypeError, "recv_batch(handle, count, limit, max_frames=-1, "
                            "name=None, routes=None, known=None)");
    void *sock = handle_of(args[0]);
    if (!sock)
        return NULL;
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[2]);
    Py_ssize_t max_frames = nargs > 3 ? PyLong_AsSsize_t(args[3]) : -1;
    if (PyErr_Occurred())
        return NULL;
    if (max_frames < 0)
        max_frames = PY_SSIZE_T_MAX;
    const char *name = NULL;
    if (nargs > 4 && args[4] != Py_None) {
        name = PyUnicode_AsUTF8(args[4]);
        if (!name)
            return NULL;
    }
    PyObject *routes = NULL;
    if (nargs > 5 && args[5] != Py_None) {
        if (!PyDict_Check(args[5]))
            return PyErr_Format(PyExc_TypeError, "routes must be a dict");
        routes = args[5];
    }
    PyObject *known = NULL;
    size_t known_max = 0; /* (no frame longer than the longest known is looked up) */
    if (nargs > 6 && args[6] != Py_None) {
        if (!PyTuple_Check(args[6]))
            return PyErr_Format(PyExc_TypeError, "known must be a tuple of bytes");
        known = args[6];
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(known); i++) {
            PyObject *frame = PyTuple_GET_ITEM(known, i);
            if (!PyBytes_Check(frame))
                return PyErr_Format(PyExc_TypeError, "known must be a tuple of bytes");
            if ((size_t)PyBytes_GET_SIZE(frame) > known_max)
                known_max = (size_t)PyBytes_GET_SIZE(frame);
        }
    }
    PyObject *batch = PyList_New(0);
    if (!batch)
        return NULL;
    zmq_msg msg;
    int noted_fd = -1;        /* routes[noted_fd] is noted_first (held by the batch) */
    PyObject *noted_first = NULL;
    for (Py_ssize_t n = 0; n < count; n++) {
        msg_init(&msg);
        if (msg_recv(&msg, sock, ZMQ_DONTWAIT) < 0) {
            int code = zmq_errno_();
            msg_close(&msg);
            if (code == EAGAIN || PyList_GET_SIZE(batch))
                break; /* a real error shows again on the next call */
            Py_DECREF(batch);
            return raise_errno(code);
        }
        PyObject *first = PyBytes_FromStringAndSize(msg_data(&msg), (Py_ssize_t)msg_size(&msg));
        int more = msg_more(&msg);
        PyObject *value = NULL;
        if (name && !more)
            value = property_of(&msg, name);
        int fd = routes && !more ? msg_get(&msg, ZMQ_SRCFD) : -1;
        msg_close(&msg);
        PyObject *rest = recv_rest(sock, more, limit, max_frames, name, &value,
                                   routes ? &fd : NULL, known, known_max);
        PyObject *item = NULL;
        if (first && rest && routes && fd >= 0) {
            /* (a batch's messages mostly come by one connection: noted once) */
            if (fd == noted_fd && PyBytes_GET_SIZE(first) == PyBytes_GET_SIZE(noted_first)
                && memcmp(PyBytes_AS_STRING(first), PyBytes_AS_STRING(noted_first),
                          (size_t)PyBytes_GET_SIZE(first)) == 0)
                ;
            else if (note_route(routes, fd, first) < 0)
                Py_CLEAR(rest);
            else {
                noted_fd = fd;
                noted_first = first;
            }
        }
        if (first && rest && (!name || value))
            item = name ? PyTuple_Pack(3, first, rest, value) : PyTuple_Pack(2, first, rest);
        Py_XDECREF(first);
        Py_XDECREF(rest);
        Py_XDECREF(value);
        if (!item || PyList_Append(batch, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(batch);
            return NULL;
        }
        Py_DECREF(item);
    }
    return batch;
}

PyDoc_STRVAR(send_doc,
"send(handle, frames) -> bool\n\n"
"Send a sequence of bytes-like frames as one message without waiting. False\n"
"when the socket cannot take it now (nothing was sent).");

/* Send `head` (head_len bytes; none when NULL) and then the frames of the sequence `frames`
 * as one message, without waiting: Py_True, Py_False when the socket cannot take it now
 * (nothing was sent), or NULL with an exception. Every frame is checked before the first
 * goes out: a message is sent whole or not at all. Returns a new reference. */
static PyObject *
send_message(void *sock, const char *head, size_t head_len, PyObject *frames)
{
    PyObject *seq = PySequence_Fast(frames, "frames must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_buffer stack[16]; /* (a Safir-Darbaan REQ at a ROUTER is 10 frames) */
    Py_buffer *views = n <= 16 ? stack : PyMem_New(Py_buffer, n);
    Py_ssize_t held = 0;
    PyObject *result = NULL;
    if (!views) {
        PyErr_NoMemory();
        goto done;
    }
    if (n == 0 && !head) {
        PyErr_SetString(PyExc_ValueError, "a message needs at least one frame");
        goto done;
    }
    for (; held < n; held++) {
        PyObject *item = items[held];
        if (PyBytes_CheckExact(item)) { /* (the usual: read in place, held by seq) */
            views[held].buf = PyBytes_AS_STRING(item);
            views[held].len = PyBytes_GET_SIZE(item);
            views[held].obj = NULL; /* nothing to release */
        } else if (PyObject_GetBuffer(item, &views[held], PyBUF_SIMPLE) < 0)
            goto done;
    }
    result = Py_True;
    Py_ssize_t first = 0;
    if (head) {
        if (zmq_send_(sock, head, head_len, ZMQ_DONTWAIT | (n ? ZMQ_SNDMORE : 0)) < 0) {
            int code = zmq_errno_();
            result = code == EAGAIN ? Py_False : raise_errno(code);
            goto done;
        }
        first = -1; /* the head was the first frame */
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int flags = ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0);
        if (zmq_send_(sock, views[i].buf, (size_t)views[i].len, flags) < 0) {
            int code = zmq_errno_();
            /* Once the first frame is taken, ZeroMQ takes the whole message. */
            result = (code == EAGAIN && i == first) ? Py_False : raise_errno(code);
            break;
        }
    }
done:
    while (held > 0)
        PyBuffer_Release(&views[--held]);
    if (views != stack)
        PyMem_Free(views);
    Py_DECREF(seq);
    Py_XINCREF(result);
    return result;
}

static PyObject *
send_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2)
        return PyErr_Format(PyExc_TypeError, "send(handle, frames)");
    void *sock = handle_of(args[0]);
    if (!sock)
        return NULL;
    return send_message(sock, NULL, 0, args[1]);
}

PyDoc_STRVAR(send_numbered_doc,
"send_numbered(handle, head, sequence, frames) -> bool\n\n"
"send(handle, (head', *frames)) where head' is head (bytes, at least 6 long) with\n"
"octets 4 and 5 replaced by sequence (0-65535) in network order: the frame 0 of a\n"
"numbered command made in the call, no bytes object per message. socket is a handle,\n"
"or a list holding one at index 0, read at each call (its owner writes 0 there when\n"
"it closes the socket: ENOTSOCK then).");

static PyObject *
send_numbered(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4)
        return PyErr_Format(PyExc_TypeError, "send_numbered(handle, head, sequence, frames)");
    PyObject *handle = args[0];
    if (PyList_Check(handle)) {
        if (PyList_GET_SIZE(handle) < 1)
            return PyErr_Format(PyExc_TypeError, "a handle box holds the handle at 0");
        handle = PyList_GET_ITEM(handle, 0);
    }
    void *sock = handle_of(handle);
    if (!sock)
        return NULL;
    if (!PyBytes_Check(args[1]) || PyBytes_GET_SIZE(args[1]) < 6)
        return PyErr_Format(PyExc_TypeError, "head must be bytes of at least 6 octets");
    long sequence = PyLong_AsLong(args[2]);
    if (sequence == -1 && PyErr_Occurred())
        return NULL;
    if (sequence < 0 || sequence > 0xFFFF)
        return PyErr_Format(PyExc_ValueError, "sequence %ld is not in 0-65535", sequence);
    Py_ssize_t size = PyBytes_GET_SIZE(args[1]);
    char stack[256];
    char *head = size <= (Py_ssize_t)sizeof stack ? stack : PyMem_Malloc((size_t)size);
    if (!head)
        return PyErr_NoMemory();
    memcpy(head, PyBytes_AS_STRING(args[1]), (size_t)size);
    head[4] = (char)(sequence >> 8);
    head[5] = (char)(sequence & 0xFF);
    PyObject *result = send_message(sock, head, (size_t)size, args[3]);
    if (head != stack)
        PyMem_Free(head);
    return result;
}

PyDoc_STRVAR(send_each_doc,
"send_each(handle, messages) -> int\n\n"
"send(handle, frames) for each frames of messages (any iterable, a deque say), in\n"
"order, until one cannot go now: how many went. A backlog is flushed in one call\n"
"instead of one Python call and loop step per message.");

static PyObject *
send_each(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2)
        return PyErr_Format(PyExc_TypeError, "send_each(handle, messages)");
    PyObject *it = PyObject_GetIter(args[1]);
    if (!it)
        return NULL;
    Py_ssize_t done = 0;
    PyObject *frames;
    while ((frames = PyIter_Next(it)) != NULL) {
        PyObject *one[2] = {args[0], frames};
        PyObject *went = send_frames(self, one, 2);
        Py_DECREF(frames);
        if (!went)
            break; /* an error: raised below, as a loop of send() would */
        int taken = went == Py_True;
        Py_DECREF(went);
        if (!taken)
            break;
        done++;
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromSsize_t(done);
}

PyDoc_STRVAR(events_doc,
"events(handle) -> int\n\n"
"The socket's ZMQ_EVENTS (POLLIN 1 | POLLOUT 2), as pyzmq's Socket.get(zmq.EVENTS)\n"
"gives it, without building an option enum per call.");

static PyObject *
events(PyObject *self, PyObject *arg)
{
    void *sock = handle_of(arg);
    if (!sock)
        return NULL;
    int value = 0;
    size_t size = sizeof value;
    if (zmq_getsockopt_(sock, ZMQ_EVENTS, &value, &size) < 0)
        return raise_errno(zmq_errno_());
    return PyLong_FromLong(value);
}

static PyMethodDef methods[] = {
    {"load", load, METH_VARARGS, load_doc},
    {"recv_batch", (PyCFunction)(void (*)(void))recv_batch, METH_FASTCALL, recv_batch_doc},
    {"send", (PyCFunction)(void (*)(void))send_frames, METH_FASTCALL, send_doc},
    {"send_each", (PyCFunction)(void (*)(void))send_each, METH_FASTCALL, send_each_doc},
    {"send_numbered", (PyCFunction)(void (*)(void))send_numbered, METH_FASTCALL,
     send_numbered_doc},
    {"events", events, METH_O, events_doc},
    {"zre_take", (PyCFunction)(void (*)(void))zre_take, METH_FASTCALL, zre_take_doc},
    {"sada_take", (PyCFunction)(void (*)(void))sada_take, METH_FASTCALL, sada_take_doc},
    {"sada_submit", (PyCFunction)(void (*)(void))sada_submit, METH_FASTCALL, sada_submit_doc},
    {"sada_jobs", (PyCFunction)(void (*)(void))sada_jobs, METH_FASTCALL, sada_jobs_doc},
    {"flux_take", (PyCFunction)(void (*)(void))flux_take, METH_FASTCALL, flux_take_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "peermesh.io._zmqbatch",
    "Batched ZeroMQ receive and send for peermesh (see peermesh/io/zmqbatch.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__zmqbatch(void)
{
    PyObject *m = PyModule_Create(&module);
    /* recv_batch takes known (a build without it lacks this name) */
    if (m && PyModule_AddIntConstant(m, "KNOWN_FRAMES", 1) < 0)
        Py_CLEAR(m);
    return m;
}
