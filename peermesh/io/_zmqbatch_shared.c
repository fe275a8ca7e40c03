/*
 * peermesh.io._zmqbatch, what the protocols' fast paths share: the checks of their start
 * index and shape, and the slots of a class found once and read, set or filled in place.
 */
#include "_zmqbatch.h"

Py_ssize_t
slot_offset(PyTypeObject *cls, PyObject *name)
{
    PyObject *descr = _PyType_Lookup(cls, name); /* borrowed */
    return descr && Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
           ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX
           ? ((PyMemberDescrObject *)descr)->d_member->offset : 0;
}

/* Where the slots of a plain class with __slots__ only (no __dict__, no base but object)
 * live in an instance, found once per class. */
int
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
        PyObject *name = PyUnicode_InternFromString(layout->names[i]);
        if (!name)
            return -1;
        offsets[i] = slot_offset(cls, name);
        Py_DECREF(name);
        if (!offsets[i])
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
PyObject *
layout_new(slot_layout *layout, PyObject *const *values)
{
    PyObject *obj = layout->cls->tp_alloc(layout->cls, 0);
    for (int i = 0; obj && i < layout->count; i++)
        *(PyObject **)((char *)obj + layout->offsets[i]) = Py_NewRef(values[i]);
    return obj;
}

int
batch_start(PyObject *start, Py_ssize_t *at)
{
    *at = PyLong_AsSsize_t(start);
    if (*at == -1 && PyErr_Occurred())
        return -1;
    if (*at < 0)
        return PyErr_Format(PyExc_ValueError, "start must not be negative"), -1;
    return 0;
}

int
shape_of(PyObject *shape, Py_ssize_t n, const char *what)
{
    if (PyTuple_Check(shape) && PyTuple_GET_SIZE(shape) == n)
        return 1;
    PyErr_Format(PyExc_TypeError, "shape is %s", what);
    return 0;
}

int
set_slot(PyObject *obj, slot_layout *layout, int i, PyObject *value)
{
    if (!value)
        return -1;
    Py_XSETREF(*(PyObject **)((char *)obj + layout->offsets[i]), value);
    return 0;
}

int
of_layout(PyObject *obj, slot_layout *layout)
{
    if (Py_TYPE(obj) == layout->cls || layout_for(layout, (PyObject *)Py_TYPE(obj)) == 0)
        return 1;
    PyErr_Clear();
    return 0;
}
