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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <dlfcn.h>
#include <errno.h>
#include <string.h>

#define ZMQ_DONTWAIT 1
#define ZMQ_SNDMORE 2
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
static int (*zmq_send_)(void *, const void *, size_t, int);
static int (*zmq_getsockopt_)(void *, int, void *, size_t *);
static int (*zmq_errno_)(void);
static void (*zmq_version_)(int *, int *, int *);

static PyObject *error_class; /* zmq.ZMQError, called with an errno */
static int loaded;

static PyObject *
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


/* --- ZRE: a batch's WHISPERs and SHOUTs taken in (zre_take) --------------------- */

/* The event class's fields, in the order zre_take sets them, and where each lives in an
 * instance (its __slots__ members), found once per class. */
static const char *const event_fields[] = {"type", "peer", "name", "group", "frames",
                                           "headers", "address", "reason"};
#define EVENT_FIELDS 8
static PyTypeObject *event_class; /* the class event_offsets were found for */
static Py_ssize_t event_offsets[EVENT_FIELDS];

static int
find_event_offsets(PyTypeObject *cls)
{
    if (cls == event_class)
        return 0;
    Py_ssize_t offsets[EVENT_FIELDS];
    for (int i = 0; i < EVENT_FIELDS; i++) {
        PyObject *descr = PyObject_GetAttrString((PyObject *)cls, event_fields[i]);
        if (!descr)
            return -1;
        int slot = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                   ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        if (slot)
            offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
        Py_DECREF(descr);
        if (!slot) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", cls->tp_name,
                         event_fields[i]);
            return -1;
        }
    }
    memcpy(event_offsets, offsets, sizeof offsets);
    Py_INCREF(cls);
    Py_XSETREF(event_class, cls);
    return 0;
}

/* A new event of class `cls` with the given fields (the others None), as
 * cls(type, peer, name, group, frames) makes it, without running __init__. */
static PyObject *
new_event(PyTypeObject *cls, PyObject *type, PyObject *peer, PyObject *name, PyObject *group,
          PyObject *frames)
{
    PyObject *event = cls->tp_alloc(cls, 0);
    if (!event)
        return NULL;
    PyObject *values[EVENT_FIELDS] = {type, peer, name, group, frames, Py_None, Py_None,
                                      Py_None};
    for (int i = 0; i < EVENT_FIELDS; i++) {
        Py_INCREF(values[i]);
        *(PyObject **)((char *)event + event_offsets[i]) = values[i];
    }
    return event;
}

static PyObject *s_ready, *s_want, *s_uuid, *s_name, *s_last_seen, *s_next_ping, *s_refresh;

static int
intern_names(void)
{
    if (s_refresh)
        return 0;
#define NAME(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1;
    NAME(s_ready, "ready");
    NAME(s_want, "want");
    NAME(s_uuid, "uuid");
    NAME(s_name, "name");
    NAME(s_last_seen, "last_seen");
    NAME(s_next_ping, "next_ping");
    NAME(s_refresh, "refresh");
#undef NAME
    return 0;
}

/* A peer's fields zre_take reads or writes, and where each lives in an instance of the
 * last peer class seen when it is a slot (0: through getattr/setattr). */
enum { P_READY, P_WANT, P_UUID, P_NAME, P_LAST_SEEN, P_NEXT_PING, PEER_FIELDS };
static PyObject **const peer_names[PEER_FIELDS] = {&s_ready, &s_want, &s_uuid, &s_name,
                                                   &s_last_seen, &s_next_ping};
static PyTypeObject *peer_class;
static Py_ssize_t peer_offsets[PEER_FIELDS];

static Py_ssize_t
peer_offset(PyObject *peer, int field)
{
    PyTypeObject *cls = Py_TYPE(peer);
    if (cls != peer_class) {
        for (int i = 0; i < PEER_FIELDS; i++) {
            PyObject *descr = _PyType_Lookup(cls, *peer_names[i]); /* borrowed */
            peer_offsets[i] = descr && Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                              ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX
                              ? ((PyMemberDescrObject *)descr)->d_member->offset : 0;
        }
        Py_INCREF(cls);
        Py_XSETREF(peer_class, cls);
    }
    return peer_offsets[field];
}

/* peer.<field> (a new reference; NULL with an exception). */
static PyObject *
peer_get(PyObject *peer, int field)
{
    Py_ssize_t offset = peer_offset(peer, field);
    PyObject *value = offset ? *(PyObject **)((char *)peer + offset) : NULL;
    return value ? Py_NewRef(value) : PyObject_GetAttr(peer, *peer_names[field]);
}

/* peer.<field> = value (-1 with an exception). */
static int
peer_set(PyObject *peer, int field, PyObject *value)
{
    Py_ssize_t offset = peer_offset(peer, field);
    if (!offset)
        return PyObject_SetAttr(peer, *peer_names[field], value);
    Py_XSETREF(*(PyObject **)((char *)peer + offset), Py_NewRef(value));
    return 0;
}

/* The peer's field as a C long (-1 with an exception). */
static long
peer_long(PyObject *peer, int field)
{
    PyObject *value = peer_get(peer, field);
    if (!value)
        return -1;
    long result = PyLong_AsLong(value);
    Py_DECREF(value);
    return result;
}

PyDoc_STRVAR(zre_take_doc,
"zre_take(batch, start, peers, groups, now, events, sizes, shape) -> (end, whispers, shouts)\n\n"
"ZRE's Session.delivery_each over a mailbox batch in one call, each event appended to\n"
"the list events and its content's octets to the list sizes (or None). batch holds\n"
"(routing id, frames) tuples (frames None: over the limits); from index start on, each\n"
"message that is the next WHISPER of a ready peer of the dict peers (by routing id), or\n"
"its next SHOUT into a group whose encoded name the dict groups maps to the group, is\n"
"taken in: the peer's want advanced (mod 65536), its last_seen set to now, refresh(now)\n"
"called when its next_ping is set, and the event made as\n"
"event_class(type, peer.uuid, peer.name, group, content frames) would be (its fields are\n"
"slots; __init__ is not run). shape is (event_class, WHISPER prefix, WHISPER type,\n"
"SHOUT prefix, SHOUT type), the prefixes being a header's first 4 octets. Stops at the\n"
"first message it does not take: end is its index (len(batch): none), whispers and\n"
"shouts how many of each were taken.");

static PyObject *
zre_take(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8)
        return PyErr_Format(PyExc_TypeError, "zre_take(batch, start, peers, groups, now, "
                            "events, sizes, shape)");
    PyObject *batch = args[0], *peers = args[2], *groups = args[3], *now = args[4];
    PyObject *events = args[5], *sizes = args[6], *shape = args[7];
    if (!PyList_Check(batch) && !PyTuple_Check(batch))
        return PyErr_Format(PyExc_TypeError, "batch must be a list or tuple");
    if (!PyDict_Check(peers) || !PyDict_Check(groups) || !PyList_Check(events) ||
        (sizes != Py_None && !PyList_Check(sizes)))
        return PyErr_Format(PyExc_TypeError, "peers and groups must be dicts, events and "
                            "sizes lists");
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != 5)
        return PyErr_Format(PyExc_TypeError, "shape is (event_class, WHISPER prefix, WHISPER "
                            "type, SHOUT prefix, SHOUT type)");
    PyTypeObject *cls = (PyTypeObject *)PyTuple_GET_ITEM(shape, 0);
    PyObject *whisper_prefix = PyTuple_GET_ITEM(shape, 1);
    PyObject *whisper_type = PyTuple_GET_ITEM(shape, 2);
    PyObject *shout_prefix = PyTuple_GET_ITEM(shape, 3);
    PyObject *shout_type = PyTuple_GET_ITEM(shape, 4);
    if (!PyType_Check(cls) || !PyBytes_Check(whisper_prefix) || !PyBytes_Check(shout_prefix) ||
        PyBytes_GET_SIZE(whisper_prefix) != 4 || PyBytes_GET_SIZE(shout_prefix) != 4)
        return PyErr_Format(PyExc_TypeError, "shape: a class, then 4-octet prefixes");
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    if (at == -1 && PyErr_Occurred())
        return NULL;
    if (intern_names() < 0 || find_event_offsets(cls) < 0)
        return NULL;
    const char *wp = PyBytes_AS_STRING(whisper_prefix), *sp = PyBytes_AS_STRING(shout_prefix);
    PyObject *const *items = PySequence_Fast_ITEMS(batch);
    Py_ssize_t end = PySequence_Fast_GET_SIZE(batch);
    Py_ssize_t whispers = 0, shouts = 0;
    int failed = 0;
    for (; at < end; at++) {
        PyObject *item = items[at];
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2)
            break;
        PyObject *frames = PyTuple_GET_ITEM(item, 1);
        if (!PyList_Check(frames) || PyList_GET_SIZE(frames) == 0)
            break;
        PyObject *peer = PyDict_GetItemWithError(peers, PyTuple_GET_ITEM(item, 0));
        if (!peer) {
            failed = PyErr_Occurred() != NULL;
            break;
        }
        Py_INCREF(peer); /* (a refresh could drop the table's reference) */
        PyObject *ready = peer_get(peer, P_READY);
        int is_ready = ready ? PyObject_IsTrue(ready) : -1;
        Py_XDECREF(ready);
        long want = is_ready > 0 ? peer_long(peer, P_WANT) : -1;
        PyObject *head = PyList_GET_ITEM(frames, 0);
        Py_ssize_t n = PyList_GET_SIZE(frames), octets = 0;
        PyObject *group = NULL;
        int kind = 0; /* 1: a WHISPER, 2: a SHOUT */
        if (is_ready < 0 || (want == -1 && PyErr_Occurred())) {
            failed = 1;
        } else if (is_ready && PyBytes_Check(head)) {
            const unsigned char *h = (const unsigned char *)PyBytes_AS_STRING(head);
            Py_ssize_t size = PyBytes_GET_SIZE(head);
            long sequence = size >= 6 ? (long)(h[4] << 8 | h[5]) : -1;
            if (size == 6 && sequence == want && memcmp(h, wp, 4) == 0) {
                kind = 1;
                group = Py_None;
            } else if (size > 6 && sequence == want && memcmp(h, sp, 4) == 0) {
                PyObject *field = PyBytes_FromStringAndSize((const char *)h + 6, size - 6);
                group = field ? PyDict_GetItemWithError(groups, field) : NULL;
                Py_XDECREF(field);
                if (group)
                    kind = 2;
                else
                    failed = PyErr_Occurred() != NULL;
            }
        }
        for (Py_ssize_t i = 1; kind && i < n; i++) {
            PyObject *frame = PyList_GET_ITEM(frames, i);
            if (!PyBytes_Check(frame))
                kind = 0; /* (not read off a socket: left to delivery_each) */
            else
                octets += PyBytes_GET_SIZE(frame);
        }
        PyObject *frozen = kind ? PyTuple_New(n - 1) : NULL; /* the content frames */
        for (Py_ssize_t i = 1; frozen && i < n; i++)
            PyTuple_SET_ITEM(frozen, i - 1, Py_NewRef(PyList_GET_ITEM(frames, i)));
        PyObject *uuid = frozen ? peer_get(peer, P_UUID) : NULL;
        PyObject *name = uuid ? peer_get(peer, P_NAME) : NULL;
        PyObject *event = name ? new_event(cls, kind == 1 ? whisper_type : shout_type, uuid,
                                           name, group, frozen) : NULL;
        Py_XDECREF(frozen);
        Py_XDECREF(uuid);
        Py_XDECREF(name);
        if (!event) {
            failed = failed || (kind && PyErr_Occurred());
            Py_DECREF(peer);
            break;
        }
        /* taken in, as delivery_each does: the sequence, the time, the silence */
        PyObject *next = PyLong_FromLong((want + 1) & 0xFFFF);
        int ok = next && peer_set(peer, P_WANT, next) == 0 &&
                 peer_set(peer, P_LAST_SEEN, now) == 0;
        Py_XDECREF(next);
        PyObject *ping = ok ? peer_get(peer, P_NEXT_PING) : NULL;
        int pinged = ping ? PyObject_IsTrue(ping) : -1;
        Py_XDECREF(ping);
        if (pinged > 0) {
            PyObject *done = PyObject_CallMethodOneArg(peer, s_refresh, now);
            pinged = done ? 0 : -1;
            Py_XDECREF(done);
        }
        Py_DECREF(peer);
        PyObject *size = NULL;
        if (pinged < 0 || PyList_Append(events, event) < 0 ||
            (sizes != Py_None && (!(size = PyLong_FromSsize_t(octets)) ||
                                  PyList_Append(sizes, size) < 0))) {
            Py_XDECREF(size);
            Py_DECREF(event);
            failed = 1;
            break;
        }
        Py_XDECREF(size);
        Py_DECREF(event);
        if (kind == 1)
            whispers++;
        else
            shouts++;
    }
    if (failed)
        return NULL;
    PyObject *counts[3] = {PyLong_FromSsize_t(at), PyLong_FromSsize_t(whispers),
                           PyLong_FromSsize_t(shouts)};
    PyObject *result = counts[0] && counts[1] && counts[2] ? PyTuple_New(3) : NULL;
    for (int i = 0; i < 3; i++) {
        if (result)
            PyTuple_SET_ITEM(result, i, counts[i]);
        else
            Py_XDECREF(counts[i]);
    }
    return result;
}

/* --- Safir-Darbaan: a channel's batch of usual REPs taken in (sada_take) -------------- */

static PyObject *s_server, *s_identity, *s_raw, *s_token, *s_body, *s_parked, *s_sent_at,
    *s_last_heard, *s_suspect, *s_replies, *s_latency, *s_in_flight, *s_empty;

static int
sada_names(void)
{
    if (s_empty)
        return 0;
#define NAME(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1;
    NAME(s_server, "server");
    NAME(s_identity, "identity");
    NAME(s_raw, "raw");
    NAME(s_token, "token");
    NAME(s_body, "body");
    NAME(s_parked, "parked");
    NAME(s_sent_at, "sent_at");
    NAME(s_last_heard, "last_heard");
    NAME(s_suspect, "suspect");
    NAME(s_replies, "replies");
    NAME(s_latency, "latency");
    NAME(s_in_flight, "in_flight");
#undef NAME
    return (s_empty = PyBytes_FromStringAndSize(NULL, 0)) ? 0 : -1;
}

/* obj.name as a double into *out (-1 with an exception). */
static int
attr_double(PyObject *obj, PyObject *name, double *out)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    if (!value)
        return -1;
    *out = PyFloat_AsDouble(value);
    Py_DECREF(value);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* The truth of obj.name (-1 with an exception). */
static int
attr_true(PyObject *obj, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    int truth = value ? PyObject_IsTrue(value) : -1;
    Py_XDECREF(value);
    return truth;
}

/* obj.name += delta, an int (-1 with an exception). */
static int
attr_add(PyObject *obj, PyObject *name, long delta)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    PyObject *step = value ? PyLong_FromLong(delta) : NULL;
    PyObject *sum = step ? PyNumber_Add(value, step) : NULL;
    int result = sum ? PyObject_SetAttr(obj, name, sum) : -1;
    Py_XDECREF(value);
    Py_XDECREF(step);
    Py_XDECREF(sum);
    return result;
}

static int
same_octets(PyObject *frame, PyObject *expected)
{
    return frame == expected || (PyBytes_GET_SIZE(frame) == PyBytes_GET_SIZE(expected) &&
                                 memcmp(PyBytes_AS_STRING(frame), PyBytes_AS_STRING(expected),
                                        PyBytes_GET_SIZE(frame)) == 0);
}

PyDoc_STRVAR(sada_take_doc,
"sada_take(batch, start, pendings, now, sink, shape) -> end\n\n"
"RequestRouter.answer_each's usual case over a batch in one call. batch holds\n"
"(routing id, frames) tuples (frames None: over the limits); from index start on, each\n"
"message that is a REP as the spec draws it (six bytes frames: empty, the protocol,\n"
"REP, a request id, a status below 400, the payload) for a request of the dict pendings\n"
"that the sending server holds (request.server.identity is the routing id), neither\n"
"parked nor answered, whose payload unpacks, is taken in: the server's last_heard set\n"
"to now, suspect False, replies + 1, latency moved by ewma towards the reply time,\n"
"add(reply time) called; the request out of pendings (token None, body b'', server\n"
"None, the server's in_flight - 1) and sink((token, value, None)) called unless its\n"
"token is the forgotten one. shape is (protocol frame, REP frame, status_of dict\n"
"(status frame -> int), unpack(payload) for requests not raw, the forgotten token,\n"
"add, ewma). Stops at the first message it does not take: end is its index\n"
"(len(batch): none); an error of unpack stops there too (the caller's path decides).");

static PyObject *
sada_take(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6)
        return PyErr_Format(PyExc_TypeError,
                            "sada_take(batch, start, pendings, now, sink, shape)");
    PyObject *batch = args[0], *pendings = args[2], *now = args[3], *sink = args[4];
    PyObject *shape = args[5];
    if (!PyList_Check(batch) && !PyTuple_Check(batch))
        return PyErr_Format(PyExc_TypeError, "batch must be a list or tuple");
    if (!PyDict_Check(pendings) || !PyCallable_Check(sink))
        return PyErr_Format(PyExc_TypeError, "pendings must be a dict, sink callable");
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != 7)
        return PyErr_Format(PyExc_TypeError, "shape is (protocol, REP, status_of, unpack, "
                            "forgotten, add, ewma)");
    PyObject *protocol = PyTuple_GET_ITEM(shape, 0), *rep = PyTuple_GET_ITEM(shape, 1);
    PyObject *status_of = PyTuple_GET_ITEM(shape, 2), *unpack = PyTuple_GET_ITEM(shape, 3);
    PyObject *forgotten = PyTuple_GET_ITEM(shape, 4), *add = PyTuple_GET_ITEM(shape, 5);
    if (!PyBytes_Check(protocol) || !PyBytes_Check(rep) || !PyDict_Check(status_of) ||
        !PyCallable_Check(unpack) || !PyCallable_Check(add))
        return PyErr_Format(PyExc_TypeError, "shape: two bytes, a dict, then unpack, "
                            "forgotten, add callable, ewma");
    double ewma = PyFloat_AsDouble(PyTuple_GET_ITEM(shape, 6));
    if (ewma == -1.0 && PyErr_Occurred())
        return NULL;
    double when = PyFloat_AsDouble(now);
    if (when == -1.0 && PyErr_Occurred())
        return NULL;
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    if (at == -1 && PyErr_Occurred())
        return NULL;
    if (at < 0)
        return PyErr_Format(PyExc_ValueError, "start must not be negative");
    if (sada_names() < 0)
        return NULL;
    int failed = 0;
    /* (the batch's length is read again for every message: a sink may change it) */
    for (; !failed && at < PySequence_Fast_GET_SIZE(batch); at++) {
        PyObject *item = PySequence_Fast_GET_ITEM(batch, at);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2)
            break;
        PyObject *identity = PyTuple_GET_ITEM(item, 0), *list = PyTuple_GET_ITEM(item, 1);
        if (!PyList_Check(list) || PyList_GET_SIZE(list) != 6)
            break;
        PyObject *f[6];
        int bytes = 1;
        for (int i = 0; i < 6; i++) {
            f[i] = PyList_GET_ITEM(list, i);
            bytes = bytes && PyBytes_Check(f[i]);
        }
        if (!bytes || PyBytes_GET_SIZE(f[0]) != 0 || !same_octets(f[2], rep) ||
            !same_octets(f[1], protocol))
            break;
        PyObject *code = PyDict_GetItemWithError(status_of, f[4]); /* borrowed */
        long status = code ? PyLong_AsLong(code) : -1;
        if (!code || status == -1 || status >= 400) {
            failed = PyErr_Occurred() != NULL;
            break;
        }
        PyObject *pending = PyDict_GetItemWithError(pendings, f[3]); /* borrowed */
        if (!pending) {
            failed = PyErr_Occurred() != NULL;
            break;
        }
        /* held for the whole message: unpack, add and sink run Python code */
        PyObject *rid = Py_NewRef(f[3]), *payload = Py_NewRef(f[5]);
        Py_INCREF(item);
        Py_INCREF(pending);
        PyObject *server = PyObject_GetAttr(pending, s_server);
        PyObject *holder = server && server != Py_None ? PyObject_GetAttr(server, s_identity)
                                                       : NULL;
        int held = holder ? PyObject_RichCompareBool(holder, identity, Py_EQ) : 0;
        Py_XDECREF(holder);
        PyObject *token = held > 0 ? PyObject_GetAttr(pending, s_token) : NULL;
        int parked = token && token != Py_None ? attr_true(pending, s_parked) : 1;
        int raw = parked == 0 ? attr_true(pending, s_raw) : -1;
        PyObject *value = NULL;
        if (raw > 0)
            value = Py_NewRef(payload);
        else if (raw == 0 && PyBytes_GET_SIZE(payload) == 0)
            value = Py_NewRef(Py_None);
        else if (raw == 0) {
            value = PyObject_CallOneArg(unpack, payload);
            if (!value && PyErr_ExceptionMatches(PyExc_Exception))
                PyErr_Clear(); /* not msgpack: the caller's path makes the error */
        }
        double sent_at = 0, latency = 0;
        int ok = value && attr_double(pending, s_sent_at, &sent_at) == 0 &&
                 attr_double(server, s_latency, &latency) == 0;
        if (ok) { /* taken in: the server's counts, then the request out of every table */
            double seconds = when - sent_at;
            PyObject *moved = PyFloat_FromDouble(latency + ewma * (seconds - latency));
            PyObject *sample = moved ? PyFloat_FromDouble(seconds) : NULL;
            PyObject *done = sample ? PyObject_CallOneArg(add, sample) : NULL;
            ok = done && PyObject_SetAttr(server, s_last_heard, now) == 0 &&
                 PyObject_SetAttr(server, s_suspect, Py_False) == 0 &&
                 attr_add(server, s_replies, 1) == 0 &&
                 PyObject_SetAttr(server, s_latency, moved) == 0 &&
                 PyObject_SetAttr(pending, s_token, Py_None) == 0 &&
                 PyObject_SetAttr(pending, s_body, s_empty) == 0 &&
                 PyDict_DelItem(pendings, rid) == 0 &&
                 attr_add(server, s_in_flight, -1) == 0 &&
                 PyObject_SetAttr(pending, s_server, Py_None) == 0;
            Py_XDECREF(moved);
            Py_XDECREF(sample);
            Py_XDECREF(done);
            if (ok && token != forgotten) {
                PyObject *answer = PyTuple_Pack(3, token, value, Py_None);
                PyObject *sunk = answer ? PyObject_CallOneArg(sink, answer) : NULL;
                ok = sunk != NULL;
                Py_XDECREF(answer);
                Py_XDECREF(sunk);
            }
            failed = !ok;
        } else {
            failed = PyErr_Occurred() != NULL;
        }
        Py_XDECREF(value);
        Py_XDECREF(token);
        Py_XDECREF(server);
        Py_DECREF(pending);
        Py_DECREF(item);
        Py_DECREF(rid);
        Py_DECREF(payload);
        if (!ok)
            break;
    }
    return failed ? NULL : PyLong_FromSsize_t(at);
}

/* --- Safir-Darbaan: a channel's usual request recorded and its REQ made (sada_submit) --- */

/* Where the slots of a plain class with __slots__ only (no __dict__, no base but object)
 * live in an instance, found once per class. */
#define MAX_SLOTS 16
typedef struct {
    PyTypeObject *cls;
    int count;
    const char *const *names;
    Py_ssize_t offsets[MAX_SLOTS];
} slot_layout;

static int
layout_for(slot_layout *layout, PyObject *cls_object)
{
    if (!PyType_Check(cls_object))
        return PyErr_Format(PyExc_TypeError, "not a class"), -1;
    PyTypeObject *cls = (PyTypeObject *)cls_object;
    if (cls == layout->cls)
        return 0;
    PyObject *slots = cls->tp_base == &PyBaseObject_Type && !cls->tp_dictoffset
                      ? PyDict_GetItemString(cls->tp_dict, "__slots__") : NULL; /* borrowed */
    Py_ssize_t declared = slots && (PyTuple_Check(slots) || PyList_Check(slots))
                          ? PySequence_Size(slots) : -1;
    if (declared != layout->count)
        return PyErr_Format(PyExc_TypeError, "%s must declare exactly %d __slots__",
                            cls->tp_name, layout->count), -1;
    Py_ssize_t offsets[MAX_SLOTS];
    for (int i = 0; i < layout->count; i++) {
        PyObject *descr = PyObject_GetAttrString(cls_object, layout->names[i]);
        if (!descr)
            return -1;
        int slot = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                   ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        if (slot)
            offsets[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
        Py_DECREF(descr);
        if (!slot)
            return PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", cls->tp_name,
                                layout->names[i]), -1;
    }
    memcpy(layout->offsets, offsets, sizeof offsets);
    Py_INCREF(cls);
    Py_XSETREF(layout->cls, cls);
    return 0;
}

/* A new instance of the layout's class with every slot set to values (in the layout's
 * order; each value gets a reference), without running __init__. */
static PyObject *
layout_new(slot_layout *layout, PyObject *const *values)
{
    PyObject *obj = layout->cls->tp_alloc(layout->cls, 0);
    for (int i = 0; obj && i < layout->count; i++)
        *(PyObject **)((char *)obj + layout->offsets[i]) = Py_NewRef(values[i]);
    return obj;
}

static const char *const pending_slots[] = {
    "rid", "service", "version", "fields", "body", "raw", "token", "timeout", "server",
    "target", "sent_at", "attempts", "retries", "excluded", "parked", "deadline"};
static slot_layout pending_layout = {NULL, 16, pending_slots, {0}};
static const char *const send_slots[] = {"link", "frames"};
static slot_layout send_layout = {NULL, 2, send_slots, {0}};

static PyObject *s_timeout, *s_counter, *s_outputs, *s_deadline, *s_append;

static int
submit_names(void)
{
    if (s_append)
        return 0;
#define NAME(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1;
    NAME(s_timeout, "timeout");
    NAME(s_counter, "_counter");
    NAME(s_outputs, "_outputs");
    NAME(s_deadline, "deadline");
    NAME(s_append, "append");
#undef NAME
    return 0;
}

/* The one server of the first version group of groups (a route: a list of (version frame,
 * servers) tuples) when it is alone there and not suspect: *frame and *server get new
 * references. 0 when the route is another (nothing set), -1 with an exception. */
static int
usual_route(PyObject *groups, PyObject **frame, PyObject **server)
{
    if (!groups || !PyList_Check(groups) || PyList_GET_SIZE(groups) < 1)
        return 0;
    PyObject *group = PyList_GET_ITEM(groups, 0);
    if (!PyTuple_Check(group) || PyTuple_GET_SIZE(group) != 2 ||
        !PyBytes_Check(PyTuple_GET_ITEM(group, 0)) || !PyList_Check(PyTuple_GET_ITEM(group, 1))
        || PyList_GET_SIZE(PyTuple_GET_ITEM(group, 1)) != 1)
        return 0;
    PyObject *only = Py_NewRef(PyList_GET_ITEM(PyTuple_GET_ITEM(group, 1), 0));
    PyObject *first = Py_NewRef(PyTuple_GET_ITEM(group, 0));
    int suspect = attr_true(only, s_suspect);
    if (suspect != 0) {
        Py_DECREF(only);
        Py_DECREF(first);
        return suspect < 0 ? -1 : 0;
    }
    *frame = first;
    *server = only;
    return 1;
}

PyDoc_STRVAR(sada_submit_doc,
"sada_submit(router, token, service, category, action, payload, now, shape) -> rid or None\n\n"
"RequestRouter.submit's usual request (no version, timeout, server, retries, not raw) in\n"
"one call, for a router whose Sends are addressed: when the (service, category, action)\n"
"fields are cached, the route of (service, None) is cached with one server alone in its\n"
"best version, not suspect, and the request's deadline (now + router.timeout) is not\n"
"before the last one queued, the payload is packed, the request (of pending_class, its\n"
"__init__ not run) recorded as sent to that server (router._counter + 1 in its id, in\n"
"pendings and due, the server's in_flight + 1) and a send_class(routing id, REQ frames)\n"
"appended to router._outputs: its request id is returned. Otherwise None, nothing done.\n"
"shape is (fields dict, route cache dict, pendings dict, due deque, pack, request id\n"
"prefix, pending_class, send_class, delimiter, protocol, REQ, no exclusion).");

static PyObject *
sada_submit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8)
        return PyErr_Format(PyExc_TypeError, "sada_submit(router, token, service, category, "
                            "action, payload, now, shape)");
    PyObject *router = args[0], *token = args[1], *payload = args[5], *now = args[6];
    PyObject *shape = args[7];
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != 12)
        return PyErr_Format(PyExc_TypeError, "shape is (fields, routes, pendings, due, pack, "
                            "prefix, pending class, send class, delimiter, protocol, REQ, "
                            "no exclusion)");
    PyObject *const *s = &PyTuple_GET_ITEM(shape, 0);
    PyObject *fields_of = s[0], *routes = s[1], *pendings = s[2], *due = s[3], *pack = s[4];
    PyObject *prefix = s[5];
    if (!PyDict_Check(fields_of) || !PyDict_Check(routes) || !PyDict_Check(pendings) ||
        !PyCallable_Check(pack) || !PyBytes_Check(prefix) || !PyBytes_Check(s[8]) ||
        !PyBytes_Check(s[9]) || !PyBytes_Check(s[10]))
        return PyErr_Format(PyExc_TypeError, "shape: three dicts, a deque, pack callable, "
                            "then bytes, two classes, three bytes");
    double when = PyFloat_AsDouble(now);
    if (when == -1.0 && PyErr_Occurred())
        return NULL;
    if (sada_names() < 0 || submit_names() < 0 || layout_for(&pending_layout, s[6]) < 0 ||
        layout_for(&send_layout, s[7]) < 0)
        return NULL;
    /* the usual request? (its fields known, its route one server) */
    PyObject *key = PyTuple_Pack(3, args[2], args[3], args[4]);
    PyObject *fields = key ? PyDict_GetItemWithError(fields_of, key) : NULL;
    Py_XDECREF(key);
    if (!fields)
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    if (!PyTuple_Check(fields) || PyTuple_GET_SIZE(fields) != 3)
        Py_RETURN_NONE;
    Py_INCREF(fields);
    PyObject *frame = NULL, *server = NULL, *timeout = NULL, *body = NULL, *identity = NULL;
    PyObject *counter = NULL, *rid = NULL, *result = NULL;
    key = PyTuple_Pack(2, args[2], Py_None);
    PyObject *groups = key ? PyDict_GetItemWithError(routes, key) : NULL;
    Py_XDECREF(key);
    int usual = groups ? usual_route(groups, &frame, &server) : -(PyErr_Occurred() != NULL);
    if (usual <= 0)
        goto done;
    usual = -1;
    identity = PyObject_GetAttr(server, s_identity);
    if (!identity)
        goto done;
    usual = PyBytes_Check(identity) && PyBytes_Check(PyTuple_GET_ITEM(fields, 0)) &&
            PyBytes_Check(PyTuple_GET_ITEM(fields, 1)) &&
            PyBytes_Check(PyTuple_GET_ITEM(fields, 2));
    if (!usual)
        goto done;
    /* its deadline, after the last one queued (else: the heap, Python's path) */
    usual = -1;
    double wait = 0;
    timeout = PyObject_GetAttr(router, s_timeout);
    if (!timeout || ((wait = PyFloat_AsDouble(timeout)) == -1.0 && PyErr_Occurred()))
        goto done;
    double deadline = when + wait;
    Py_ssize_t queued = PyObject_Size(due);
    if (queued < 0)
        goto done;
    if (queued > 0) {
        double last = 0;
        PyObject *tail = PySequence_GetItem(due, queued - 1);
        int read = tail ? attr_double(tail, s_deadline, &last) : -1;
        Py_XDECREF(tail);
        if (read < 0)
            goto done;
        if (last > deadline) {
            usual = 0;
            goto done;
        }
    }
    body = PyObject_CallOneArg(pack, payload); /* (an error: raised, nothing taken) */
    if (!body)
        goto done;
    if (!PyBytes_Check(body)) {
        usual = 0;
        goto done;
    }
    /* its id: the prefix, then the counter in hex */
    counter = PyObject_GetAttr(router, s_counter);
    unsigned long long count = counter ? PyLong_AsUnsignedLongLong(counter) : (unsigned long long)-1;
    if (count == (unsigned long long)-1 || count >= (1ULL << 62)) {
        if (!PyErr_Occurred())
            usual = 0;
        else if (PyErr_ExceptionMatches(PyExc_OverflowError) ||
                 PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            usual = 0;
        }
        goto done;
    }
    Py_SETREF(counter, PyLong_FromUnsignedLongLong(count + 1));
    char hex[24];
    int digits = snprintf(hex, sizeof hex, "%llx", count + 1);
    Py_ssize_t size = PyBytes_GET_SIZE(prefix);
    rid = counter ? PyBytes_FromStringAndSize(NULL, size + digits) : NULL;
    if (!rid)
        goto done;
    memcpy(PyBytes_AS_STRING(rid), PyBytes_AS_STRING(prefix), size);
    memcpy(PyBytes_AS_STRING(rid) + size, hex, digits);
    /* the request, sent to the server; its REQ */
    PyObject *one = PyLong_FromLong(1), *zero = PyLong_FromLong(0);
    PyObject *end = PyFloat_FromDouble(deadline);
    PyObject *pending = NULL, *frames = NULL, *send = NULL;
    if (one && zero && end) {
        PyObject *values[16] = {rid, args[2], Py_None, fields, body, Py_False, token, timeout,
                                server, Py_None, now, one, zero, s[11], Py_False, end};
        pending = layout_new(&pending_layout, values);
    }
    if (pending)
        frames = PyTuple_Pack(10, identity, s[8], s[9], s[10], rid,
                              PyTuple_GET_ITEM(fields, 0), frame, PyTuple_GET_ITEM(fields, 1),
                              PyTuple_GET_ITEM(fields, 2), body);
    if (frames) {
        PyObject *values[2] = {identity, frames};
        send = layout_new(&send_layout, values);
    }
    PyObject *outputs = send ? PyObject_GetAttr(router, s_outputs) : NULL;
    if (outputs && !PyList_Check(outputs))
        PyErr_SetString(PyExc_TypeError, "router._outputs must be a list");
    PyObject *appended = NULL;
    int ok = outputs && PyList_Check(outputs) &&
             PyObject_SetAttr(router, s_counter, counter) == 0 &&
             PyDict_SetItem(pendings, rid, pending) == 0 &&
             (appended = PyObject_CallMethodOneArg(due, s_append, pending)) != NULL &&
             attr_add(server, s_in_flight, 1) == 0 && PyList_Append(outputs, send) == 0;
    Py_XDECREF(appended);
    Py_XDECREF(outputs);
    Py_XDECREF(send);
    Py_XDECREF(frames);
    Py_XDECREF(pending);
    Py_XDECREF(one);
    Py_XDECREF(zero);
    Py_XDECREF(end);
    if (ok)
        result = Py_NewRef(rid);
done:
    if (!result && usual == 0 && !PyErr_Occurred())
        result = Py_NewRef(Py_None);
    Py_DECREF(fields);
    Py_XDECREF(frame);
    Py_XDECREF(server);
    Py_XDECREF(identity);
    Py_XDECREF(timeout);
    Py_XDECREF(body);
    Py_XDECREF(counter);
    Py_XDECREF(rid);
    return result;
}

/* --- Safir-Darbaan: a server's batch of usual REQs handed to their handlers (sada_jobs) */

static PyObject *s_by_frames, *s_with_request, *s_inline, *s_serving, *s_max_concurrent,
    *s_busy, *s_requests;

static int
jobs_names(void)
{
    if (s_requests)
        return 0;
#define NAME(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1;
    NAME(s_by_frames, "by_frames");
    NAME(s_with_request, "with_request");
    NAME(s_inline, "inline");
    NAME(s_serving, "serving");
    NAME(s_max_concurrent, "max_concurrent");
    NAME(s_busy, "busy");
    NAME(s_requests, "requests");
#undef NAME
    return 0;
}

/* table[(first, second)] (a new reference), or NULL: none (or an exception). */
static PyObject *
pair_lookup(PyObject *table, PyObject *first, PyObject *second)
{
    PyObject *key = PyTuple_Pack(2, first, second);
    PyObject *value = key ? PyDict_GetItemWithError(table, key) : NULL;
    Py_XDECREF(key);
    return Py_XNewRef(value);
}

/* The handler of a REQ whose frames are f (nine bytes objects, checked) that the server
 * `core` would run now: a new reference; NULL when it would not (or an exception). */
static PyObject *
usual_handler(PyObject *core, PyObject *by_frames, PyObject *const *f)
{
    PyObject *service = pair_lookup(by_frames, f[4], f[5]);
    PyObject *handlers = service ? PyObject_GetAttr(service, s_by_frames) : NULL;
    Py_XDECREF(service);
    if (handlers && !PyDict_Check(handlers)) {
        Py_DECREF(handlers);
        return NULL;
    }
    PyObject *handler = handlers ? pair_lookup(handlers, f[6], f[7]) : NULL;
    Py_XDECREF(handlers);
    int other = handler ? attr_true(handler, s_with_request) : -1;
    int serving = other == 0 ? attr_true(core, s_serving) : -1;
    if (serving != 1)
        Py_CLEAR(handler);
    return handler;
}

/* A handler not run inline takes one of max_concurrent: 1 when it may run (busy + 1),
 * 0 when max_concurrent run already, -1 with an exception. */
static int
take_a_place(PyObject *core)
{
    PyObject *limit = PyObject_GetAttr(core, s_max_concurrent);
    if (!limit)
        return -1;
    int result = 1;
    if (limit != Py_None) {
        PyObject *busy = PyObject_GetAttr(core, s_busy);
        result = busy ? !PyObject_RichCompareBool(busy, limit, Py_GE) : -1;
        if (busy && PyErr_Occurred())
            result = -1;
        Py_XDECREF(busy);
    }
    Py_DECREF(limit);
    return result == 1 && attr_add(core, s_busy, 1) < 0 ? -1 : result;
}

PyDoc_STRVAR(sada_jobs_doc,
"sada_jobs(batch, start, core, sink, shape) -> end\n\n"
"ServerCore.job_each's usual case over a batch in one call. batch holds (alias, frames)\n"
"tuples (frames None: over the limits); from index start on, each message that is a REQ\n"
"as the spec draws it (nine bytes frames: empty, the protocol, REQ, a request id of 1 to\n"
"max_id octets, then service, version, category, action and payload) for a service of\n"
"the dict by_frames (by its name and version frames) whose by_frames has a handler for\n"
"its category and action frames, not with_request, while core.serving, is handed on:\n"
"a handler not inline takes one of core.max_concurrent (core.busy + 1; the message\n"
"stops the call when they all run), stats['requests'] + 1 and sink(job_class((alias,\n"
"handler, request id, payload, None))) called (a tuple subclass, made as tuple.__new__\n"
"makes it). shape is (by_frames, stats, job_class, protocol, REQ, max_id). Stops at\n"
"the first message it does not take: end is its index (len(batch): none).");

static PyObject *
sada_jobs(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5)
        return PyErr_Format(PyExc_TypeError, "sada_jobs(batch, start, core, sink, shape)");
    PyObject *batch = args[0], *core = args[2], *sink = args[3], *shape = args[4];
    if (!PyList_Check(batch) && !PyTuple_Check(batch))
        return PyErr_Format(PyExc_TypeError, "batch must be a list or tuple");
    if (!PyCallable_Check(sink))
        return PyErr_Format(PyExc_TypeError, "sink must be callable");
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != 6)
        return PyErr_Format(PyExc_TypeError, "shape is (by_frames, stats, job_class, "
                            "protocol, REQ, max_id)");
    PyObject *by_frames = PyTuple_GET_ITEM(shape, 0), *stats = PyTuple_GET_ITEM(shape, 1);
    PyObject *job_class = PyTuple_GET_ITEM(shape, 2), *protocol = PyTuple_GET_ITEM(shape, 3);
    PyObject *req = PyTuple_GET_ITEM(shape, 4);
    if (!PyDict_Check(by_frames) || !PyDict_Check(stats) || !PyType_Check(job_class) ||
        !PyType_IsSubtype((PyTypeObject *)job_class, &PyTuple_Type) ||
        !PyBytes_Check(protocol) || !PyBytes_Check(req))
        return PyErr_Format(PyExc_TypeError, "shape: two dicts, a tuple subclass, two bytes, "
                            "an int");
    Py_ssize_t max_id = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 5));
    if (max_id == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    if (at == -1 && PyErr_Occurred())
        return NULL;
    if (at < 0)
        return PyErr_Format(PyExc_ValueError, "start must not be negative");
    PyObject *one = PyLong_FromLong(1);
    if (!one || jobs_names() < 0) {
        Py_XDECREF(one);
        return NULL;
    }
    int failed = 0;
    /* (the batch's length is read again for every message: a sink may change it) */
    for (; at < PySequence_Fast_GET_SIZE(batch); at++) {
        PyObject *item = PySequence_Fast_GET_ITEM(batch, at);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2)
            break;
        PyObject *list = PyTuple_GET_ITEM(item, 1);
        if (!PyList_Check(list) || PyList_GET_SIZE(list) != 9)
            break;
        PyObject *f[9];
        int bytes = 1;
        for (int i = 0; i < 9; i++) {
            f[i] = PyList_GET_ITEM(list, i);
            bytes = bytes && PyBytes_Check(f[i]);
        }
        if (!bytes || PyBytes_GET_SIZE(f[0]) != 0 || !same_octets(f[2], req) ||
            !same_octets(f[1], protocol) || PyBytes_GET_SIZE(f[3]) < 1 ||
            PyBytes_GET_SIZE(f[3]) > max_id)
            break;
        /* (held while Python code runs: the message and the frames a job takes) */
        Py_INCREF(item);
        PyObject *rid = Py_NewRef(f[3]), *payload = Py_NewRef(f[8]);
        PyObject *handler = usual_handler(core, by_frames, f);
        int inline_ = handler ? attr_true(handler, s_inline) : -1;
        int place = inline_ == 0 ? take_a_place(core) : inline_;
        PyObject *count = place == 1 ? PyDict_GetItemWithError(stats, s_requests) : NULL;
        PyObject *more = count ? PyNumber_Add(count, one) : NULL;
        PyObject *job = more && PyDict_SetItem(stats, s_requests, more) == 0
                        ? ((PyTypeObject *)job_class)->tp_alloc((PyTypeObject *)job_class, 5)
                        : NULL;
        Py_XDECREF(more);
        if (job) {
            PyObject *values[5] = {PyTuple_GET_ITEM(item, 0), handler, rid, payload, Py_None};
            for (int i = 0; i < 5; i++)
                PyTuple_SET_ITEM(job, i, Py_NewRef(values[i]));
        }
        Py_XDECREF(handler);
        PyObject *sunk = job ? PyObject_CallOneArg(sink, job) : NULL;
        Py_XDECREF(job);
        Py_DECREF(rid);
        Py_DECREF(payload);
        Py_DECREF(item);
        if (!sunk) {
            failed = PyErr_Occurred() != NULL;
            break;
        }
        Py_DECREF(sunk);
    }
    Py_DECREF(one);
    return failed ? NULL : PyLong_FromSsize_t(at);
}

/* --- Flux: a batch's common hops forwarded in one call (flux_take) ---------------- */

/* RFC 3's PROTO frame (peermesh/wire/flux.py): magic, version, type, flags, userid,
 * rolemask, aux1 (a request's nodeid, a response's errnum), aux2 (the matchtag), the four
 * words in network order. */
#define FLUX_PROTO_SIZE 20
#define FLUX_MAGIC 0x8E
#define FLUX_VERSION 0x01
#define FLUX_REQUEST 0x01
#define FLUX_RESPONSE 0x02
#define FLUX_TOPIC 0x01
#define FLUX_PAYLOAD 0x02
#define FLUX_NORESPONSE 0x04
#define FLUX_ROUTE 0x08
#define FLUX_UPSTREAM 0x10
#define FLUX_STREAMING 0x40
#define FLUX_FRAME_BITS 0x0B
#define FLUX_MAX_RANK 0xFFFFFFFDUL
#define FLUX_IDENTITY_SIZE 16 /* a node's routing id (peermesh/flux/outputs.py) */
#define FLUX_MAX_FRAMES 64    /* a message with more goes the Python way */
#define FLUX_SHAPE 13

static PyObject *s_heard, *s_sent, *s_torpid, *s_parent_heard, *s_parent_sent;

static int
flux_names(void)
{
    if (s_heard)
        return 0;
    s_sent = PyUnicode_InternFromString("sent");
    s_torpid = PyUnicode_InternFromString("torpid");
    s_parent_heard = PyUnicode_InternFromString("parent_heard");
    s_parent_sent = PyUnicode_InternFromString("parent_sent");
    s_heard = PyUnicode_InternFromString("heard"); /* (last: the others are made then) */
    return s_heard && s_sent && s_torpid && s_parent_heard && s_parent_sent ? 0 : -1;
}

static unsigned long
flux_word(const unsigned char *p)
{
    return (unsigned long)p[0] << 24 | (unsigned long)p[1] << 16 | (unsigned long)p[2] << 8 |
           (unsigned long)p[3];
}

typedef struct {
    const char *buf;
    size_t len;
} flux_part;

/* Send parts[0..n) as one message without waiting: 1 sent, 0 not taken (the first frame
 * refused: EAGAIN, a peer gone, a closed socket; nothing went), -1 with ZMQError (a later
 * frame refused, which ZeroMQ does not do once it took the first). */
static int
flux_send(void *sock, const flux_part *parts, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        int flags = ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0);
        if (zmq_send_(sock, parts[i].buf, parts[i].len, flags) < 0) {
            if (i == 0)
                return 0;
            raise_errno(zmq_errno_());
            return -1;
        }
    }
    return 1;
}

static void
flux_part_of(flux_part *part, PyObject *frame)
{
    part->buf = PyBytes_AS_STRING(frame);
    part->len = (size_t)PyBytes_GET_SIZE(frame);
}

/* (link, matchtag, *routes) or, with target, (target, matchtag, link, *routes): the key
 * Routing.inflight keeps a forwarded request under. */
static PyObject *
flux_key(PyObject *target, unsigned long matchtag, PyObject *link, PyObject *const *routes,
         Py_ssize_t d)
{
    Py_ssize_t head = target ? 3 : 2;
    PyObject *tag = PyLong_FromUnsignedLong(matchtag);
    PyObject *key = tag ? PyTuple_New(head + d) : NULL;
    if (!key) {
        Py_XDECREF(tag);
        return NULL;
    }
    if (target) {
        PyTuple_SET_ITEM(key, 0, Py_NewRef(target));
        PyTuple_SET_ITEM(key, 1, tag);
        PyTuple_SET_ITEM(key, 2, Py_NewRef(link));
    } else {
        PyTuple_SET_ITEM(key, 0, Py_NewRef(link));
        PyTuple_SET_ITEM(key, 1, tag);
    }
    for (Py_ssize_t i = 0; i < d; i++)
        PyTuple_SET_ITEM(key, head + i, Py_NewRef(routes[i]));
    return key;
}

PyDoc_STRVAR(flux_take_doc,
"flux_take(batch, start, link, now, shape) -> (end, forwarded, used)\n\n"
"Route the common Flux messages of batch (as recv_batch reads them), from index start\n"
"on, as Routing.pass_through does, sending each in the call: a request for another\n"
"rank forwarded to the child on its path or the parent (the route pushed, the request\n"
"kept in inflight unless NORESPONSE), a response for a child or the parent sent back\n"
"(its route popped, a final one forgotten in inflight), a broker.ping for this rank\n"
"whose body is not JSON echoed. link is None for a batch of the ROUTER (each item\n"
"(sender identity, frames)) or PARENT for one of the DEALER to the parent (each item\n"
"(first frame, other frames)). shape is (router handle, dealer handle (0: none),\n"
"PARENT, routing (its parent_heard and parent_sent are set to now), inflight, children,\n"
"by_rank, rank, k, ranks (rank 0's size, else 2**32), parent (bool: one to send up to),\n"
"placed (rank -> the child it was reported below), max_inflight); each child's heard,\n"
"torpid and sent are kept as pass_through keeps them. Stops at the first message it\n"
"does not take (anything else, anything malformed, a send that cannot go now): end is\n"
"its index, forwarded how many requests went on, used 1 | 2 for the ROUTER and the\n"
"DEALER sent on (each to be looked at once after the batch: a send may take in the\n"
"edge of a message waiting there). An error after messages were taken\n"
"ends the call there, as taken (the next call meets it again).");

static PyObject *
flux_take(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5)
        return PyErr_Format(PyExc_TypeError, "flux_take(batch, start, link, now, shape)");
    PyObject *batch = args[0], *link = args[2], *now = args[3], *shape = args[4];
    if (!PyList_Check(batch))
        return PyErr_Format(PyExc_TypeError, "batch must be a list");
    if (link != Py_None && !PyBytes_CheckExact(link))
        return PyErr_Format(PyExc_TypeError, "link must be None or bytes");
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != FLUX_SHAPE)
        return PyErr_Format(PyExc_TypeError, "shape is (router, dealer, PARENT, routing, "
                            "inflight, children, by_rank, rank, k, ranks, parent, placed, "
                            "max_inflight)");
    PyObject *parent_id = PyTuple_GET_ITEM(shape, 2), *routing = PyTuple_GET_ITEM(shape, 3);
    PyObject *inflight = PyTuple_GET_ITEM(shape, 4), *children = PyTuple_GET_ITEM(shape, 5);
    PyObject *by_rank = PyTuple_GET_ITEM(shape, 6), *placed = PyTuple_GET_ITEM(shape, 11);
    if (!PyBytes_CheckExact(parent_id) || !PyDict_Check(inflight) || !PyDict_Check(children)
        || !PyDict_Check(by_rank) || !PyDict_Check(placed))
        return PyErr_Format(PyExc_TypeError, "shape: PARENT bytes; inflight, children, "
                            "by_rank and placed dicts");
    if (link != Py_None && link != parent_id)
        return PyErr_Format(PyExc_ValueError, "link must be None or PARENT");
    if (!loaded)
        return PyErr_Format(PyExc_RuntimeError, "call load() first");
    void *router = PyLong_AsVoidPtr(PyTuple_GET_ITEM(shape, 0));
    void *dealer = router || !PyErr_Occurred() ? PyLong_AsVoidPtr(PyTuple_GET_ITEM(shape, 1))
                                               : NULL;
    if (PyErr_Occurred())
        return NULL;
    unsigned long rank = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(shape, 7));
    unsigned long k = rank != (unsigned long)-1 || !PyErr_Occurred()
                      ? PyLong_AsUnsignedLong(PyTuple_GET_ITEM(shape, 8)) : 0;
    unsigned long long ranks = PyErr_Occurred() ? 0
                               : PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(shape, 9));
    int parent = PyErr_Occurred() ? -1 : PyObject_IsTrue(PyTuple_GET_ITEM(shape, 10));
    Py_ssize_t max_inflight = parent < 0 ? -1 : PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 12));
    if (PyErr_Occurred())
        return NULL;
    if (rank > FLUX_MAX_RANK)
        return PyErr_Format(PyExc_ValueError, "rank %lu is not a rank", rank);
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    if (at == -1 && PyErr_Occurred())
        return NULL;
    if (at < 0)
        return PyErr_Format(PyExc_ValueError, "start must not be negative");
    if (flux_names() < 0)
        return NULL;
    const char *parent_buf = PyBytes_AS_STRING(parent_id);
    Py_ssize_t parent_len = PyBytes_GET_SIZE(parent_id);
    Py_ssize_t start = at, forwarded = 0;
    int heard_parent = 0, sent_parent = 0, failed = 0, used = 0;
    PyObject *topic = NULL; /* the last topic decoded, and its frame */
    PyObject *topic_frame = NULL;
    for (; at < PyList_GET_SIZE(batch); at++) {
        PyObject *item = PyList_GET_ITEM(batch, at);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2)
            break;
        PyObject *first = PyTuple_GET_ITEM(item, 0), *rest = PyTuple_GET_ITEM(item, 1);
        if (!PyBytes_CheckExact(first) || !PyList_CheckExact(rest)) /* (None: oversized) */
            break;
        Py_ssize_t n = PyList_GET_SIZE(rest) + (link != Py_None);
        if (n < 3 || n > FLUX_MAX_FRAMES)
            break;
        Py_INCREF(item); /* (its frames are read while Python code may run) */
        PyObject *f[FLUX_MAX_FRAMES];
        PyObject *from = link == Py_None ? first : link; /* the link it came on */
        Py_ssize_t i = 0;
        if (link != Py_None)
            f[i++] = first;
        for (Py_ssize_t j = 0; i < n; i++, j++) {
            f[i] = PyList_GET_ITEM(rest, j);
            if (!PyBytes_CheckExact(f[i]))
                break;
        }
        PyObject *child = NULL, *below = NULL, *key = NULL, *value = NULL;
        int taken = 0, to_parent = 0, kind = 0, flags = 0;
        Py_ssize_t last = n - 1, d = 0;
        const unsigned char *p = i == n ? (const unsigned char *)PyBytes_AS_STRING(f[last])
                                        : NULL;
        if (p && PyBytes_GET_SIZE(f[last]) == FLUX_PROTO_SIZE && p[0] == FLUX_MAGIC &&
            p[1] == FLUX_VERSION) {
            kind = p[2];
            flags = p[3];
        }
        unsigned long aux1 = kind ? flux_word(p + 12) : 0, aux2 = kind ? flux_word(p + 16) : 0;
        if ((kind != FLUX_REQUEST && kind != FLUX_RESPONSE) || !(flags & FLUX_ROUTE) ||
            (flags & FLUX_NORESPONSE && flags & FLUX_STREAMING))
            goto next;
        while (d < last && PyBytes_GET_SIZE(f[d]))
            d++;
        if (d >= last || !(flags & FLUX_TOPIC) || last - d - 2 != (flags >> 1 & 1) ||
            !PyBytes_GET_SIZE(f[d + 1]))
            goto next; /* no topic, an empty one, or frames no flag announces */
        PyObject *t = f[d + 1];
        if (!topic_frame || PyBytes_GET_SIZE(t) != PyBytes_GET_SIZE(topic_frame) ||
            memcmp(PyBytes_AS_STRING(t), PyBytes_AS_STRING(topic_frame),
                   (size_t)PyBytes_GET_SIZE(t)) != 0) {
            PyObject *decoded = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t),
                                                     "strict");
            if (!decoded) {
                if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
                    PyErr_Clear();
                else
                    failed = 1;
                goto next;
            }
            Py_XSETREF(topic, decoded);
            Py_XSETREF(topic_frame, Py_NewRef(t));
        }
        const char *tb = PyBytes_AS_STRING(t);
        size_t tl = (size_t)PyBytes_GET_SIZE(t);
        if (link == Py_None) { /* from a peer on the ROUTER: a child's, else the Python way */
            if (PyBytes_GET_SIZE(from) != FLUX_IDENTITY_SIZE)
                goto next;
            child = PyDict_GetItemWithError(children, from);
            if (!child) {
                failed = PyErr_Occurred() != NULL;
                goto next;
            }
            Py_INCREF(child);
            if (tl == 17 && memcmp(tb, "peermesh.attached", 17) == 0)
                goto next; /* (the Python way learns where that rank is) */
        }
        flux_part parts[FLUX_MAX_FRAMES + 2];
        Py_ssize_t np = 0;
        void *sock = NULL;
        unsigned char answer[FLUX_PROTO_SIZE];
        PyObject *target = NULL; /* (borrowed from by_rank, or parent_id) */
        if (kind == FLUX_RESPONSE) {
            PyObject *top = f[0];
            if (d == 0)
                goto next;
            if (PyBytes_GET_SIZE(top) == parent_len &&
                memcmp(PyBytes_AS_STRING(top), parent_buf, (size_t)parent_len) == 0) {
                if (parent <= 0 || !dealer)
                    goto next;
                sock = dealer;
                to_parent = 1;
                for (Py_ssize_t j = 1; j < n; j++)
                    flux_part_of(&parts[np++], f[j]);
            } else if (PyBytes_GET_SIZE(top) == FLUX_IDENTITY_SIZE && router) {
                sock = router; /* (the ROUTER takes the top route as the address) */
                for (Py_ssize_t j = 0; j < n; j++)
                    flux_part_of(&parts[np++], f[j]);
                below = PyDict_GetItemWithError(children, top);
                if (!below && PyErr_Occurred()) {
                    failed = 1;
                    goto next;
                }
                Py_XINCREF(below);
            } else
                goto next; /* a local handle's ("@n"), or no link: the Python way */
            if (!(flags & FLUX_STREAMING) || aux1) { /* final: what was kept of it goes */
                key = flux_key(NULL, aux2, from, f, d);
                if (!key) {
                    failed = 1;
                    goto next;
                }
            }
        } else if (aux1 == rank) { /* for this rank: a ping not in JSON is echoed */
            if (flags & (FLUX_UPSTREAM | FLUX_NORESPONSE) || tl != 11 ||
                memcmp(tb, "broker.ping", 11) != 0 ||
                (flags & FLUX_PAYLOAD && PyBytes_GET_SIZE(f[d + 2]) &&
                 PyBytes_AS_STRING(f[d + 2])[0] == '{'))
                goto next;
            static const unsigned char head[12] = {FLUX_MAGIC, FLUX_VERSION, FLUX_RESPONSE, 0,
                                                   0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0};
            memcpy(answer, head, sizeof head);
            answer[3] = (unsigned char)(flags & FLUX_FRAME_BITS);
            memset(answer + 12, 0, 4);             /* errnum 0 */
            memcpy(answer + 16, p + 16, 4);        /* the matchtag */
            if (child) {
                if (!router)
                    goto next;
                sock = router;
                flux_part_of(&parts[np++], from);
                below = Py_NewRef(child);
            } else {
                if (!dealer)
                    goto next;
                sock = dealer;
                to_parent = 1;
            }
            for (Py_ssize_t j = 0; j < last; j++)
                flux_part_of(&parts[np++], f[j]);
            parts[np].buf = (const char *)answer;
            parts[np++].len = FLUX_PROTO_SIZE;
        } else { /* for another rank: down to the child on its path, else up */
            if (aux1 > FLUX_MAX_RANK || flags & FLUX_UPSTREAM || aux1 >= ranks)
                goto next;
            /* (Routing._child_toward: up from that rank to a child, or to a rank reported
             * below a child when it attached out of its formula place) */
            for (unsigned long r = aux1; r > 0 && r != rank && PyDict_GET_SIZE(by_rank);
                 r = k ? (r - 1) / k : 0) {
                PyObject *number = PyLong_FromUnsignedLong(r);
                target = number ? PyDict_GetItemWithError(by_rank, number) : NULL;
                if (!target && number && !PyErr_Occurred() && PyDict_GET_SIZE(placed)) {
                    target = PyDict_GetItemWithError(placed, number);
                    int known = target ? PyDict_Contains(children, target) : 0;
                    if (known <= 0)
                        target = NULL;
                }
                Py_XDECREF(number);
                if (target || PyErr_Occurred())
                    break;
            }
            if (PyErr_Occurred()) {
                failed = 1;
                goto next;
            }
            if (target) {
                if (!PyBytes_CheckExact(target) || !router)
                    goto next;
                sock = router;
                flux_part_of(&parts[np++], target);
                below = PyDict_GetItemWithError(children, target);
                if (!below && PyErr_Occurred()) {
                    failed = 1;
                    goto next;
                }
                Py_XINCREF(below);
            } else {
                if (parent <= 0 || !child || !dealer) /* (never back up: no bounce) */
                    goto next;
                target = parent_id;
                sock = dealer;
                to_parent = 1;
            }
            Py_INCREF(target);
            if (!(flags & FLUX_NORESPONSE)) {
                if (PyDict_GET_SIZE(inflight) >= max_inflight) {
                    Py_DECREF(target);
                    goto next; /* (the Python way answers EAGAIN) */
                }
                key = flux_key(target, aux2, from, f, d);
                value = key ? Py_BuildValue("(OkO)", topic, aux1,
                                            flags & FLUX_STREAMING ? Py_True : Py_False)
                            : NULL;
                if (!value) {
                    Py_DECREF(target);
                    failed = 1;
                    goto next;
                }
            }
            Py_DECREF(target);
            flux_part_of(&parts[np++], from);
            for (Py_ssize_t j = 0; j < n; j++)
                flux_part_of(&parts[np++], f[j]);
        }
        int sent = flux_send(sock, parts, np);
        if (sent <= 0) {
            failed = sent < 0;
            goto next;
        }
        taken = 1; /* sent: what pass_through keeps of it */
        used |= sock == router ? 1 : 2;
        if (kind == FLUX_REQUEST && aux1 != rank)
            forwarded++;
        if (key && value)
            failed = PyDict_SetItem(inflight, key, value) < 0;
        else if (key && PyDict_DelItem(inflight, key) < 0) {
            if (PyErr_ExceptionMatches(PyExc_KeyError))
                PyErr_Clear();
            else
                failed = 1;
        }
        if (to_parent)
            sent_parent = 1;
        else if (below && !failed)
            failed = PyObject_SetAttr(below, s_sent, now) < 0;
        if (!child)
            heard_parent = 1;
        else if (!failed)
            failed = PyObject_SetAttr(child, s_heard, now) < 0 ||
                     PyObject_SetAttr(child, s_torpid, Py_False) < 0;
    next:
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(below);
        Py_XDECREF(child);
        Py_DECREF(item);
        if (taken && !failed)
            continue;
        at += taken; /* (taken, then an error: reported taken) */
        break;
    }
    Py_XDECREF(topic);
    Py_XDECREF(topic_frame);
    if (failed && at > start && PyErr_Occurred())
        PyErr_Clear(); /* the messages taken are reported; the next call meets it again */
    if (!PyErr_Occurred() && ((heard_parent &&
                               PyObject_SetAttr(routing, s_parent_heard, now) < 0) ||
                              (sent_parent && PyObject_SetAttr(routing, s_parent_sent, now) < 0)))
        failed = 1;
    if (PyErr_Occurred())
        return NULL;
    return Py_BuildValue("(nni)", at, forwarded, used);
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
