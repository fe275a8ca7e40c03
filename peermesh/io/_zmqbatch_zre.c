/*
 * peermesh.io._zmqbatch, ZRE: a batch's WHISPERs and SHOUTs taken in (zre_take).
 */
#include "_zmqbatch.h"

/* --- ZRE: a batch's WHISPERs and SHOUTs taken in (zre_take) --------------------- */

/* The event class's fields, in the order zre_take sets them (its __slots__). */
static const char *const event_fields[] = {"type", "peer", "name", "group", "frames",
                                           "headers", "address", "reason"};
static slot_layout event_layout = {NULL, 8, event_fields, {0}};

static PyObject *s_ready, *s_want, *s_uuid, *s_name, *s_last_seen, *s_next_ping, *s_refresh;

static int
intern_names(void)
{
    if (s_refresh)
        return 0;
    INTERN(s_ready, "ready");
    INTERN(s_want, "want");
    INTERN(s_uuid, "uuid");
    INTERN(s_name, "name");
    INTERN(s_last_seen, "last_seen");
    INTERN(s_next_ping, "next_ping");
    INTERN(s_refresh, "refresh");
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
        for (int i = 0; i < PEER_FIELDS; i++)
            peer_offsets[i] = slot_offset(cls, *peer_names[i]);
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

SHARED_DOC(zre_take_doc,
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

PyObject *
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
    if (!shape_of(shape, 5, "(event_class, WHISPER prefix, WHISPER type, SHOUT prefix, "
                  "SHOUT type)"))
        return NULL;
    PyTypeObject *cls = (PyTypeObject *)PyTuple_GET_ITEM(shape, 0);
    PyObject *whisper_prefix = PyTuple_GET_ITEM(shape, 1);
    PyObject *whisper_type = PyTuple_GET_ITEM(shape, 2);
    PyObject *shout_prefix = PyTuple_GET_ITEM(shape, 3);
    PyObject *shout_type = PyTuple_GET_ITEM(shape, 4);
    if (!PyType_Check(cls) || !PyBytes_Check(whisper_prefix) || !PyBytes_Check(shout_prefix) ||
        PyBytes_GET_SIZE(whisper_prefix) != 4 || PyBytes_GET_SIZE(shout_prefix) != 4)
        return PyErr_Format(PyExc_TypeError, "shape: a class, then 4-octet prefixes");
    Py_ssize_t at;
    if (batch_start(args[1], &at) < 0 || intern_names() < 0 ||
        layout_for(&event_layout, (PyObject *)cls) < 0)
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
        PyObject *fields[8] = {kind == 1 ? whisper_type : shout_type, uuid, name, group,
                               frozen, Py_None, Py_None, Py_None};
        PyObject *event = name ? layout_new(&event_layout, fields) : NULL;
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
