/*
 * peermesh.io._zmqbatch, Safir-Darbaan: a channel's usual REPs taken in (sada_take) and
 * usual requests made (sada_submit), a server's usual REQs handed on (sada_jobs).
 * Kept whole: the three are one protocol's messages, checked by the same frame helpers;
 * the two of a channel keep the same requests and servers (their slot layouts).
 */
#include "_zmqbatch.h"

/* --- Safir-Darbaan: a channel's batch of usual REPs taken in (sada_take) -------------- */

/* the attribute names the three fast paths read and set, interned once (the slots of
 * requests, servers and reply times are found by their classes' layouts instead) */
static PyObject *s_timeout, *s_counter, *s_outputs, *s_append, *s_by_frames, *s_with_request,
    *s_inline, *s_serving, *s_max_concurrent, *s_busy, *s_requests, *s_empty;

static int
sada_names(void)
{
    if (s_empty)
        return 0;
    INTERN(s_timeout, "timeout");
    INTERN(s_counter, "_counter");
    INTERN(s_outputs, "_outputs");
    INTERN(s_append, "append");
    INTERN(s_by_frames, "by_frames");
    INTERN(s_with_request, "with_request");
    INTERN(s_inline, "inline");
    INTERN(s_serving, "serving");
    INTERN(s_max_concurrent, "max_concurrent");
    INTERN(s_busy, "busy");
    INTERN(s_requests, "requests");
    return (s_empty = PyBytes_FromStringAndSize(NULL, 0)) ? 0 : -1;
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

/* The n frames (borrowed) of a batch item (routing id, frames list) into f, when they are
 * all bytes and the message's first three are the empty delimiter, protocol and command:
 * 1, else 0. */
static int
message_frames(PyObject *item, Py_ssize_t n, PyObject **f, PyObject *protocol,
               PyObject *command)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2)
        return 0;
    PyObject *list = PyTuple_GET_ITEM(item, 1);
    if (!PyList_Check(list) || PyList_GET_SIZE(list) != n)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyBytes_Check(f[i] = PyList_GET_ITEM(list, i)))
            return 0;
    return PyBytes_GET_SIZE(f[0]) == 0 && same_octets(f[2], command) &&
           same_octets(f[1], protocol);
}

/* The slots of a request (routing._Pending), a server (routing._Server) and the reply
 * times (zre.roundtrip.RoundTrip), in their classes' order. */
static const char *const pending_slots[] = {
    "rid", "service", "version", "fields", "body", "raw", "token", "timeout", "server",
    "target", "sent_at", "attempts", "retries", "excluded", "parked", "deadline"};
static slot_layout pending_layout = {NULL, 16, pending_slots, {0}};
enum { P_BODY = 4, P_RAW = 5, P_TOKEN = 6, P_SERVER = 8, P_SENT_AT = 10, P_PARKED = 14,
       P_DEADLINE = 15 };
static const char *const server_slots[] = {
    "identity", "id", "address", "services", "in_flight", "latency", "penalty",
    "penalized_at", "last_heard", "ping_sent", "suspect", "alive", "replies"};
static slot_layout server_layout = {NULL, 13, server_slots, {0}};
enum { S_IDENTITY = 0, S_IN_FLIGHT = 4, S_LATENCY = 5, S_LAST_HEARD = 8, S_SUSPECT = 10,
       S_REPLIES = 12 };
static const char *const times_slots[] = {"smoothed", "last", "count", "total", "counts"};
static slot_layout times_layout = {NULL, 5, times_slots, {0}};
enum { T_SMOOTHED = 0, T_LAST = 1, T_COUNT = 2, T_TOTAL = 3, T_COUNTS = 4 };

/* A slot's value as a double (an exact float or int), into *out: 1, else 0. */
static int
slot_double(PyObject *value, double *out)
{
    if (value && PyFloat_CheckExact(value))
        *out = PyFloat_AS_DOUBLE(value);
    else if (value && PyLong_CheckExact(value)) {
        *out = PyLong_AsDouble(value);
        if (*out == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
    } else
        return 0;
    return 1;
}

/* An exact int slot moved by delta (-1 with an exception; 0: not an exact int, unchanged). */
static int
slot_step(PyObject *obj, slot_layout *layout, int i, long delta)
{
    PyObject *value = SLOT(obj, *layout, i);
    if (!value || !PyLong_CheckExact(value))
        return 0;
    long n = PyLong_AsLong(value);
    if (n == -1 && PyErr_Occurred())
        return -1;
    return set_slot(obj, layout, i, PyLong_FromLong(n + delta)) < 0 ? -1 : 1;
}

/* RoundTrip.add(seconds) on times (of times_layout), buckets its BUCKETS: 1, -1 with an
 * exception, 0 when its slots are not as RoundTrip keeps them (nothing changed). */
static int
times_add(PyObject *times, PyObject *buckets, double seconds)
{
    PyObject *counts = SLOT(times, times_layout, T_COUNTS);
    PyObject *count = SLOT(times, times_layout, T_COUNT);
    double smoothed, total;
    if (!counts || !PyList_Check(counts) || !count || !PyLong_CheckExact(count) ||
        !slot_double(SLOT(times, times_layout, T_SMOOTHED), &smoothed) ||
        !slot_double(SLOT(times, times_layout, T_TOTAL), &total) ||
        PyList_GET_SIZE(counts) != PyTuple_GET_SIZE(buckets) + 1)
        return 0;
    if (seconds < 0)   /* (a clock that stepped back: not a sample) */
        return 1;
    Py_ssize_t bucket = 0, last = PyTuple_GET_SIZE(buckets);
    while (bucket < last && PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(buckets, bucket)) < seconds)
        bucket++;   /* (bisect_left: the first bound not below the sample) */
    PyObject *in_bucket = PyList_GET_ITEM(counts, bucket);
    if (!PyLong_CheckExact(in_bucket))
        return 0;
    long n = PyLong_AsLong(count), k = PyLong_AsLong(in_bucket);
    if ((n == -1 || k == -1) && PyErr_Occurred())
        return -1;
    smoothed = n ? smoothed + (seconds - smoothed) / 8 : seconds;
    PyObject *kept = PyLong_FromLong(k + 1);
    if (!kept || set_slot(times, &times_layout, T_SMOOTHED, PyFloat_FromDouble(smoothed)) < 0 ||
        set_slot(times, &times_layout, T_LAST, PyFloat_FromDouble(seconds)) < 0 ||
        set_slot(times, &times_layout, T_COUNT, PyLong_FromLong(n + 1)) < 0 ||
        set_slot(times, &times_layout, T_TOTAL, PyFloat_FromDouble(total + seconds)) < 0) {
        Py_XDECREF(kept);
        return -1;
    }
    PyList_SET_ITEM(counts, bucket, kept);
    Py_DECREF(in_bucket);
    return 1;
}

SHARED_DOC(sada_take_doc,
"sada_take(batch, start, pendings, now, sink, shape) -> end\n\n"
"RequestRouter.answer_each's usual case over a batch in one call. batch holds\n"
"(routing id, frames) tuples (frames None: over the limits); from index start on, each\n"
"message that is a REP as the spec draws it (six bytes frames: empty, the protocol,\n"
"REP, a request id, a status below 400, the payload) for a request of the dict pendings\n"
"that the sending server holds (request.server.identity is the routing id), neither\n"
"parked nor answered, whose payload unpacks, is taken in: the server's last_heard set\n"
"to now, suspect False, replies + 1, latency moved by ewma towards the reply time, the\n"
"reply time added to times (as RoundTrip.add does); the request out of pendings (token\n"
"None, body b'', server None, the server's in_flight - 1) and sink((token, value, None))\n"
"called unless its token is the forgotten one. The requests, servers and times are\n"
"those of routing._Pending, routing._Server and RoundTrip (their slots are read and set\n"
"as those classes lay them out). shape is (protocol frame, REP frame, status_of dict\n"
"(status frame -> int), unpack(payload) for requests not raw, the forgotten token,\n"
"times, its BUCKETS (a tuple of floats), ewma). Stops at the first message it does not\n"
"take: end is its index (len(batch): none); an error of unpack stops there too (the\n"
"caller's path decides).");

/* The reply to pending (held by server, both of their layouts) taken in: 1, -1 with an
 * exception, 0 when a slot is not as the Python path keeps it (nothing changed). */
static int
settle(PyObject *pending, PyObject *server, PyObject *times, PyObject *buckets, double when,
       PyObject *now, double ewma)
{
    double sent_at, latency;
    PyObject *replies = SLOT(server, server_layout, S_REPLIES);
    PyObject *in_flight = SLOT(server, server_layout, S_IN_FLIGHT);
    if (!slot_double(SLOT(pending, pending_layout, P_SENT_AT), &sent_at) ||
        !slot_double(SLOT(server, server_layout, S_LATENCY), &latency) ||
        !replies || !PyLong_CheckExact(replies) || !in_flight || !PyLong_CheckExact(in_flight))
        return 0;
    double seconds = when - sent_at;
    int added = times_add(times, buckets, seconds);
    if (added <= 0)
        return added;
    if (set_slot(server, &server_layout, S_LAST_HEARD, Py_NewRef(now)) < 0 ||
        set_slot(server, &server_layout, S_SUSPECT, Py_NewRef(Py_False)) < 0 ||
        slot_step(server, &server_layout, S_REPLIES, 1) < 0 ||
        set_slot(server, &server_layout, S_LATENCY,
                 PyFloat_FromDouble(latency + ewma * (seconds - latency))) < 0 ||
        slot_step(server, &server_layout, S_IN_FLIGHT, -1) < 0)
        return -1;
    set_slot(pending, &pending_layout, P_TOKEN, Py_NewRef(Py_None));
    set_slot(pending, &pending_layout, P_BODY, Py_NewRef(s_empty));
    set_slot(pending, &pending_layout, P_SERVER, Py_NewRef(Py_None));
    return 1;
}

PyObject *
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
    if (!shape_of(shape, 8, "(protocol, REP, status_of, unpack, forgotten, times, buckets, "
                  "ewma)"))
        return NULL;
    PyObject *protocol = PyTuple_GET_ITEM(shape, 0), *rep = PyTuple_GET_ITEM(shape, 1);
    PyObject *status_of = PyTuple_GET_ITEM(shape, 2), *unpack = PyTuple_GET_ITEM(shape, 3);
    PyObject *forgotten = PyTuple_GET_ITEM(shape, 4), *times = PyTuple_GET_ITEM(shape, 5);
    PyObject *buckets = PyTuple_GET_ITEM(shape, 6);
    int floats = PyTuple_Check(buckets);
    for (Py_ssize_t i = 0; floats && i < PyTuple_GET_SIZE(buckets); i++)
        floats = PyFloat_CheckExact(PyTuple_GET_ITEM(buckets, i));
    if (!PyBytes_Check(protocol) || !PyBytes_Check(rep) || !PyDict_Check(status_of) ||
        !PyCallable_Check(unpack) || !floats)
        return PyErr_Format(PyExc_TypeError, "shape: two bytes, a dict, unpack callable, "
                            "forgotten, times, a tuple of floats, ewma");
    double ewma = PyFloat_AsDouble(PyTuple_GET_ITEM(shape, 7));
    if (ewma == -1.0 && PyErr_Occurred())
        return NULL;
    double when = PyFloat_AsDouble(now);
    if (when == -1.0 && PyErr_Occurred())
        return NULL;
    Py_ssize_t at;
    if (batch_start(args[1], &at) < 0 || sada_names() < 0)
        return NULL;
    if (!of_layout(times, &times_layout))
        return PyLong_FromSsize_t(at);   /* (not RoundTrip's slots: all goes the Python way) */
    int failed = 0;
    /* (the batch's length is read again for every message: a sink may change it) */
    for (; !failed && at < PySequence_Fast_GET_SIZE(batch); at++) {
        PyObject *item = PySequence_Fast_GET_ITEM(batch, at), *f[6];
        if (!message_frames(item, 6, f, protocol, rep))
            break;
        PyObject *identity = PyTuple_GET_ITEM(item, 0);
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
        if (!of_layout(pending, &pending_layout))
            break;
        PyObject *server = SLOT(pending, pending_layout, P_SERVER);
        PyObject *token = SLOT(pending, pending_layout, P_TOKEN);
        PyObject *raw = SLOT(pending, pending_layout, P_RAW);
        PyObject *parked = SLOT(pending, pending_layout, P_PARKED);
        if (!server || server == Py_None || !of_layout(server, &server_layout) || !token ||
            token == Py_None || parked != Py_False || (raw != Py_True && raw != Py_False))
            break;
        PyObject *holder = SLOT(server, server_layout, S_IDENTITY);
        int held = holder ? PyObject_RichCompareBool(holder, identity, Py_EQ) : 0;
        if (held <= 0) {
            failed = held < 0;
            break;
        }
        /* held for the whole message: unpack and sink run Python code */
        PyObject *rid = Py_NewRef(f[3]), *payload = Py_NewRef(f[5]);
        Py_INCREF(item);
        Py_INCREF(pending);
        Py_INCREF(server);
        Py_INCREF(token);
        PyObject *value = NULL;
        if (raw == Py_True)
            value = Py_NewRef(payload);
        else if (PyBytes_GET_SIZE(payload) == 0)
            value = Py_NewRef(Py_None);
        else {
            value = PyObject_CallOneArg(unpack, payload);
            if (!value && PyErr_ExceptionMatches(PyExc_Exception))
                PyErr_Clear(); /* not msgpack: the caller's path makes the error */
        }
        /* (unpack ran Python code: the request must still be the one answered) */
        int ok = value && SLOT(pending, pending_layout, P_SERVER) == server &&
                 SLOT(pending, pending_layout, P_TOKEN) == token
                 ? settle(pending, server, times, buckets, when, now, ewma) : 0;
        if (ok > 0) {   /* taken in: the request out of the table, its caller answered */
            ok = PyDict_DelItem(pendings, rid) == 0 ? 1 : -1;
            if (ok > 0 && token != forgotten) {
                PyObject *answer = PyTuple_Pack(3, token, value, Py_None);
                PyObject *sunk = answer ? PyObject_CallOneArg(sink, answer) : NULL;
                ok = sunk ? 1 : -1;
                Py_XDECREF(answer);
                Py_XDECREF(sunk);
            }
        }
        failed = ok < 0 || (ok == 0 && PyErr_Occurred() != NULL);
        Py_XDECREF(value);
        Py_DECREF(token);
        Py_DECREF(server);
        Py_DECREF(pending);
        Py_DECREF(item);
        Py_DECREF(rid);
        Py_DECREF(payload);
        if (ok <= 0)
            break;
    }
    return failed ? NULL : PyLong_FromSsize_t(at);
}

/* --- Safir-Darbaan: a channel's usual request recorded and its REQ made (sada_submit) --- */

static const char *const send_slots[] = {"link", "frames"};
static slot_layout send_layout = {NULL, 2, send_slots, {0}};

/* The one server of the first version group of groups (a route: a list of (version frame,
 * servers) tuples) when it is alone there and not suspect (a routing._Server, its slots
 * as the Python path keeps them): *frame and *server get new references. 0 when the route
 * is another (nothing set). */
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
    PyObject *only = PyList_GET_ITEM(PyTuple_GET_ITEM(group, 1), 0);
    if (!of_layout(only, &server_layout) || SLOT(only, server_layout, S_SUSPECT) != Py_False ||
        !SLOT(only, server_layout, S_IDENTITY) || !SLOT(only, server_layout, S_IN_FLIGHT) ||
        !PyLong_CheckExact(SLOT(only, server_layout, S_IN_FLIGHT)))
        return 0;
    *frame = Py_NewRef(PyTuple_GET_ITEM(group, 0));
    *server = Py_NewRef(only);
    return 1;
}

SHARED_DOC(sada_submit_doc,
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

PyObject *
sada_submit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8)
        return PyErr_Format(PyExc_TypeError, "sada_submit(router, token, service, category, "
                            "action, payload, now, shape)");
    PyObject *router = args[0], *token = args[1], *payload = args[5], *now = args[6];
    PyObject *shape = args[7];
    if (!shape_of(shape, 12, "(fields, routes, pendings, due, pack, prefix, pending class, "
                  "send class, delimiter, protocol, REQ, no exclusion)"))
        return NULL;
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
    if (sada_names() < 0 || layout_for(&pending_layout, s[6]) < 0 ||
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
    identity = Py_NewRef(SLOT(server, server_layout, S_IDENTITY));
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
        if (!tail)
            goto done;
        int read = of_layout(tail, &pending_layout) &&
                   slot_double(SLOT(tail, pending_layout, P_DEADLINE), &last);
        Py_DECREF(tail);
        if (!read || last > deadline) {
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
    unsigned long long count = counter ? PyLong_AsUnsignedLongLong(counter)
                                       : (unsigned long long)-1;
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
    char hex[16];   /* (the counter in hex, lower case, from its last digit back) */
    int digits = 0;
    for (unsigned long long left = count + 1; left; left >>= 4)
        hex[sizeof hex - ++digits] = "0123456789abcdef"[left & 15];
    Py_ssize_t size = PyBytes_GET_SIZE(prefix);
    rid = counter ? PyBytes_FromStringAndSize(NULL, size + digits) : NULL;
    if (!rid)
        goto done;
    memcpy(PyBytes_AS_STRING(rid), PyBytes_AS_STRING(prefix), size);
    memcpy(PyBytes_AS_STRING(rid) + size, hex + sizeof hex - digits, digits);
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
             slot_step(server, &server_layout, S_IN_FLIGHT, 1) > 0 &&
             PyList_Append(outputs, send) == 0;
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

SHARED_DOC(sada_jobs_doc,
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

PyObject *
sada_jobs(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5)
        return PyErr_Format(PyExc_TypeError, "sada_jobs(batch, start, core, sink, shape)");
    PyObject *batch = args[0], *core = args[2], *sink = args[3], *shape = args[4];
    if (!PyList_Check(batch) && !PyTuple_Check(batch))
        return PyErr_Format(PyExc_TypeError, "batch must be a list or tuple");
    if (!PyCallable_Check(sink))
        return PyErr_Format(PyExc_TypeError, "sink must be callable");
    if (!shape_of(shape, 6, "(by_frames, stats, job_class, protocol, REQ, max_id)"))
        return NULL;
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
    Py_ssize_t at;
    if (batch_start(args[1], &at) < 0)
        return NULL;
    PyObject *one = PyLong_FromLong(1);
    if (!one || sada_names() < 0) {
        Py_XDECREF(one);
        return NULL;
    }
    int failed = 0;
    /* (the batch's length is read again for every message: a sink may change it) */
    for (; at < PySequence_Fast_GET_SIZE(batch); at++) {
        PyObject *item = PySequence_Fast_GET_ITEM(batch, at), *f[9];
        if (!message_frames(item, 9, f, protocol, req) || PyBytes_GET_SIZE(f[3]) < 1 ||
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
