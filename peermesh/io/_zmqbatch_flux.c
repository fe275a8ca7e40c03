/*
 * peermesh.io._zmqbatch, Flux: a batch's common hops forwarded in one call (flux_take).
 */
#include "_zmqbatch.h"

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
    INTERN(s_sent, "sent");
    INTERN(s_torpid, "torpid");
    INTERN(s_parent_heard, "parent_heard");
    INTERN(s_parent_sent, "parent_sent");
    INTERN(s_heard, "heard"); /* (last: the others are made then) */
    return 0;
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

SHARED_DOC(flux_take_doc,
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

PyObject *
flux_take(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5)
        return PyErr_Format(PyExc_TypeError, "flux_take(batch, start, link, now, shape)");
    PyObject *batch = args[0], *link = args[2], *now = args[3], *shape = args[4];
    if (!PyList_Check(batch))
        return PyErr_Format(PyExc_TypeError, "batch must be a list");
    if (link != Py_None && !PyBytes_CheckExact(link))
        return PyErr_Format(PyExc_TypeError, "link must be None or bytes");
    if (!shape_of(shape, FLUX_SHAPE, "(router, dealer, PARENT, routing, inflight, children, "
                  "by_rank, rank, k, ranks, parent, placed, max_inflight)"))
        return NULL;
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
    Py_ssize_t at;
    if (batch_start(args[1], &at) < 0 || flux_names() < 0)
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
