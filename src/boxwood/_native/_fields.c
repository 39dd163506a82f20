/* The class attribute of a module's field, in C: `boxwood._native._fields.FieldBase`.
 *
 * A *data* descriptor, so that every write to a field goes through it, also one that
 * bypasses `Module.__setattr__` (`object.__setattr__(module, "w", v)`): such a write
 * after construction must drop the flat form `filter_jit` may have cached for the
 * module (see `_module/_instance.py`, `_Field`). A data descriptor is also asked first on
 * every read, so the read here is the instance dict's lookup, in C; only a field
 * missing from the dict (a default read on the class, a module built by `filter_jit`
 * from its flat form alone) calls the subclass's Python `_missing(obj, owner)`.
 * Writes call `_write(obj, value)` and deletions `_delete(obj)` (both Python).
 *
 * The Python twin is `_module._instance._PyFieldBase` (the same three paths in
 * Python), used where this extension is not built or `BOXWOOD_PURE_PYTHON=1` is set.
 * It costs a Python call on every field read, which doubles the time of JAX's
 * flatten of a module (`benchmarks/bench_flatten.py`).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *name; /* the field's name (a str) */
} FieldBase;

static PyObject *missing_name, *write_name, *delete_name;

static PyObject *field_get(PyObject *self, PyObject *obj, PyObject *owner) {
    PyObject *name = ((FieldBase *)self)->name;
    if (obj != NULL && obj != Py_None && name != NULL) {
        PyObject *values = PyObject_GenericGetDict(obj, NULL);
        if (values == NULL) return NULL;
        PyObject *value = PyDict_GetItemWithError(values, name); /* borrowed */
        if (value != NULL) {
            Py_INCREF(value);
            Py_DECREF(values);
            return value;
        }
        Py_DECREF(values);
        if (PyErr_Occurred()) return NULL;
    }
    return PyObject_CallMethodObjArgs(self, missing_name, obj != NULL ? obj : Py_None,
                                      owner != NULL ? owner : Py_None, NULL);
}

static int field_set(PyObject *self, PyObject *obj, PyObject *value) {
    PyObject *result = value != NULL
                           ? PyObject_CallMethodObjArgs(self, write_name, obj, value, NULL)
                           : PyObject_CallMethodObjArgs(self, delete_name, obj, NULL);
    if (result == NULL) return -1;
    Py_DECREF(result);
    return 0;
}

static void field_dealloc(FieldBase *self) {
    Py_CLEAR(self->name);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef field_members[] = {
    {"name", T_OBJECT, offsetof(FieldBase, name), 0, "the field's name"},
    {NULL}};

static PyTypeObject FieldBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "boxwood._native._fields.FieldBase",
    .tp_basicsize = sizeof(FieldBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The class attribute of a module's field (a data descriptor); "
              "subclasses define `_missing(obj, owner)`, `_write(obj, value)` and "
              "`_delete(obj)`.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)field_dealloc,
    .tp_members = field_members,
    .tp_descr_get = field_get,
    .tp_descr_set = field_set,
};

static struct PyModuleDef fields_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "boxwood._native._fields",
    .m_doc = "Module fields' class attributes, in C (see `boxwood/_module/_instance.py`, `_Field`).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__fields(void) {
    missing_name = PyUnicode_InternFromString("_missing");
    write_name = PyUnicode_InternFromString("_write");
    delete_name = PyUnicode_InternFromString("_delete");
    if (missing_name == NULL || write_name == NULL || delete_name == NULL) return NULL;
    if (PyType_Ready(&FieldBaseType) < 0) return NULL;
    PyObject *m = PyModule_Create(&fields_module);
    if (m == NULL) return NULL;
    Py_INCREF(&FieldBaseType);
    if (PyModule_AddObject(m, "FieldBase", (PyObject *)&FieldBaseType) < 0) {
        Py_DECREF(&FieldBaseType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
