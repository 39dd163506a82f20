/* boxwood._native._speedups: the per-call paths of boxwood, in C: `FastCall` (the argument
 * walk, key lookup and call of `filter_jit`), `Builder` (rebuilding its outputs)
 * and `install_call` (the rebuild of modules on JAX's unflatten path).
 *
 * `FastCall` is the callable that `filter_jit` returns when this extension is
 * built. It does what the fast path of `_jit/_wrapper.py`'s `call` does, with the same
 * key (`_flat_cache.call_key` is its Python definition; tests/test_walk_agreement.py
 * checks the two agree) and the same table (`Store.fast_plans`):
 *
 *   1. walk the positional arguments (as one tuple, as the Python path does), then
 *      the keyword arguments (as a dict: sorted names, then the values): arrays,
 *      modules carrying their flat form, tuples/lists/NamedTuples of those and
 *      `None` are handled here; any other object is handed to the Python `walk`
 *      (`_flat_cache.py`), which appends to the same key and leaf lists;
 *   2. look the key up in `fast_plans`, giving `(plan, entry)`;
 *   3. call `entry.jitted` on the dynamic leaves (as `([], first, rest)`, split at
 *      `plan.n_first`, when the first argument is kept out of donation);
 *   4. notice a retrace (`store.traces` moved) and report it to `after_trace`;
 *   5. build the output with `entry.fast_build` (or `entry.output`).
 *
 * Anything else (a key not in the table, an entry whose first call has not
 * finished, another thread tracing) goes to `fallback`: the Python `call`, which
 * owns every slow path. The C code holds no cache of its own, so the two paths
 * cannot disagree about what is compiled.
 *
 * The boundary is narrow: C reads no Python attribute by name. The fields it reads
 * (`entry.cold`, `store.traces`, ...) are read through the descriptors handed to
 * `FastCall` when it is built, the flat form through the instance-dict key it is
 * handed, and the Builder's opcodes are handed to each Builder (`_jit/_rebuild.py`
 * numbers them). See `README.md`, "The C boundary".
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>
#include <structmember.h>

#define MAX_KW 32 /* calls with more keyword arguments take the Python path */
static PyObject *empty_tuple; /* () */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;        /* function attributes (`__wrapped__`, `cache_info`, ...) */
    PyObject *weaklist;
    PyObject *fallback;    /* the Python call: every path not taken here */
    PyObject *plans;       /* dict: walk key -> (plan, entry) */
    PyObject *store;       /* `Store`: `traces`, `tracing` */
    PyObject *walk;        /* `_flat_cache.walk(obj, key, dyn) -> bool` */
    PyObject *after_trace; /* `after_trace(n, args, kwargs, plan)` */
    PyObject *on_error;    /* `on_error(exc)`: called when the compiled call raised */
    PyObject *array_type;
    PyObject *array_token;
    PyObject *key_type;     /* typed PRNG key arrays' class, or None */
    PyObject *key_token;
    PyObject *none_token;
    PyObject *module_types; /* set of module classes */
    PyObject *walkable;     /* dict: type -> bool (`_flat_cache.WALKABLE`) */
    PyObject *fun_dyn;      /* the function's own arrays, or None: call `jitted(dyn)` */
    PyObject *first_name;   /* donate="...-except-first": the first parameter's name, or None */
    PyObject *flat_key;     /* the instance-dict key of a module's flat form */
    PyObject *name;         /* the wrapped function's qualified name (its repr) */
    /* how to read the Python objects this path uses: member descriptors (slots)
       and a function, handed over by `_jit/_wrapper.py` (C names no attribute) */
    PyObject *entry_cold, *entry_jitted, *entry_fast_build, *entry_output;
    PyObject *plan_n_first, *store_traces, *store_tracing;
    /* captured values (`capture/`), or `watch` None: the watched names' sources
       (a globals dict or a closure cell each), their keys (the global's name, or
       None for a cell), the object holding the snapshot of their values and the
       hidden argument, its field's descriptor, and the Python capture layer that
       takes every call whose names are not bound as in the snapshot */
    PyObject *watch, *watch_snap, *watch_sources, *watch_keys, *watch_fallback;
    int split_first;        /* call `jitted(fun_dyn, first, rest)` */
    int watch_hidden;       /* pass the snapshot's hidden argument first (else the
                               names are watched only to warn when they change) */
    Py_ssize_t hits;
    /* the last keyword names seen, their sorted order and where each sorted name
       sits among the call's keywords (call sites pass the same tuple each time) */
    PyObject *kw_names;
    PyObject *kw_order;
    Py_ssize_t kw_perm[MAX_KW];
} FastCall;

/* `obj.<field>`, where `field` is the class's descriptor for it (e.g. a slot's
 * member descriptor), handed over when the FastCall was built: a new reference. */
static PyObject *read_field(PyObject *field, PyObject *obj) {
    descrgetfunc get = Py_TYPE(field)->tp_descr_get;
    if (get == NULL) {
        PyErr_SetString(PyExc_TypeError, "FastCall: a field descriptor expected");
        return NULL;
    }
    return get(field, obj, (PyObject *)Py_TYPE(obj));
}

/* a module's flat form `(token, leaves)` from its instance dict, borrowed; NULL
 * with no error set when it has none */
static PyObject *flat_form(PyObject *obj, PyObject *flat_key) {
    PyObject *dict = PyObject_GenericGetDict(obj, NULL);
    if (dict == NULL) return NULL;
    PyObject *flat = PyDict_GetItemWithError(dict, flat_key); /* borrowed */
    Py_DECREF(dict); /* the instance keeps its dict (and the record) alive */
    return flat;
}

/* Walk one object: 1 walked, 0 not walkable (leave it to the slow path), -1 error. */
static int walk_obj(FastCall *self, PyObject *obj, PyObject *key, PyObject *dyn,
                    int depth) {
    PyTypeObject *t = Py_TYPE(obj);
    if ((PyObject *)t == self->array_type) {
        if (PyList_Append(key, self->array_token) < 0) return -1;
        return PyList_Append(dyn, obj) < 0 ? -1 : 1;
    }
    if ((PyObject *)t == self->key_type) { /* a typed PRNG key: as an array */
        if (PyList_Append(key, self->key_token) < 0) return -1;
        return PyList_Append(dyn, obj) < 0 ? -1 : 1;
    }
    if (obj == Py_None) {
        return PyList_Append(key, self->none_token) < 0 ? -1 : 1;
    }
    int is_module = PySet_Contains(self->module_types, (PyObject *)t);
    if (is_module < 0) return -1;
    if (is_module) {
        PyObject *flat = flat_form(obj, self->flat_key);
        if (flat == NULL) return PyErr_Occurred() ? -1 : 0;
        if (!PyTuple_CheckExact(flat) || PyTuple_GET_SIZE(flat) != 2 ||
            !PyList_CheckExact(PyTuple_GET_ITEM(flat, 1))) {
            return 0; /* not a flat form: leave it to the slow path */
        }
        Py_INCREF(flat);
        PyObject *leaves = PyTuple_GET_ITEM(flat, 1);
        Py_ssize_t n = PyList_GET_SIZE(dyn);
        int err = PyList_Append(key, PyTuple_GET_ITEM(flat, 0)) < 0 ||
                  PyList_SetSlice(dyn, n, n, leaves) < 0;
        Py_DECREF(flat);
        return err ? -1 : 1;
    }
    if (depth < 64 && (t == &PyTuple_Type || t == &PyList_Type ||
                       PyTuple_Check(obj))) {
        PyObject *ok = PyDict_GetItemWithError(self->walkable, (PyObject *)t);
        if (ok == NULL && PyErr_Occurred()) return -1;
        if (ok == Py_True) {
            /* a list is copied first: Python code run by the walk below (the
               Python `walk`) must not be able to shrink it under the loop */
            PyObject *seq = t == &PyList_Type ? PyList_AsTuple(obj)
                                              : PySequence_Fast(obj, "walk");
            if (seq == NULL) return -1;
            Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
            PyObject *len = PyLong_FromSsize_t(n);
            int r = 1;
            if (len == NULL || PyList_Append(key, (PyObject *)t) < 0 ||
                PyList_Append(key, len) < 0) {
                r = -1;
            }
            Py_XDECREF(len);
            for (Py_ssize_t i = 0; r == 1 && i < n; i++) {
                r = walk_obj(self, PySequence_Fast_GET_ITEM(seq, i), key, dyn,
                             depth + 1);
            }
            Py_DECREF(seq);
            return r;
        }
    }
    /* anything else: the Python walk, which appends the same key format */
    PyObject *res = PyObject_CallFunctionObjArgs(self->walk, obj, key, dyn, NULL);
    if (res == NULL) return -1;
    int r = PyObject_IsTrue(res);
    Py_DECREF(res);
    return r;
}

static PyObject *fall_back(FastCall *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames) {
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

/* `obj.<field>` is truthy: 1, falsy: 0, error: -1 */
static int field_true(PyObject *field, PyObject *obj) {
    PyObject *v = read_field(field, obj);
    if (v == NULL) return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* The sorted keyword names of a call (a new reference) and, in `perm`, the
 * position among `kwnames` of each sorted name: the order in which the Python
 * `walk` visits a dict of the keyword arguments (`_flat_cache._dict_order`). */
static PyObject *kw_order(FastCall *self, PyObject *kwnames, Py_ssize_t *perm) {
    Py_ssize_t n = PyTuple_GET_SIZE(kwnames);
    if (kwnames != self->kw_names) {
        PyObject *names = PySequence_List(kwnames);
        if (names == NULL) return NULL;
        if (PyList_Sort(names) < 0) {
            Py_DECREF(names);
            return NULL;
        }
        PyObject *order = PyList_AsTuple(names);
        Py_DECREF(names);
        if (order == NULL) return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *name = PyTuple_GET_ITEM(order, i);
            for (Py_ssize_t j = 0; j < n; j++) {
                if (PyTuple_GET_ITEM(kwnames, j) == name) {
                    self->kw_perm[i] = j;
                    break;
                }
            }
        }
        Py_INCREF(kwnames);
        Py_XSETREF(self->kw_names, kwnames);
        Py_XSETREF(self->kw_order, order);
    }
    memcpy(perm, self->kw_perm, n * sizeof(Py_ssize_t));
    Py_INCREF(self->kw_order);
    return self->kw_order;
}

/* The key of a call into `key` and its dynamic leaves into `dyn`, as the Python
 * `_flat_cache.call_key` gives them: the walk of the positional arguments as one
 * tuple, then of the keyword arguments as a dict (sorted names, then the values).
 * 1 walked, 0 not walkable (the slow path), -1 error. */
static int call_key(FastCall *self, PyObject *const *args, Py_ssize_t nargs,
                    PyObject *kwnames, PyObject *key, PyObject *dyn) {
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *n_args = PyLong_FromSsize_t(nargs);
    int r = n_args != NULL && PyList_Append(key, (PyObject *)&PyTuple_Type) == 0 &&
                    PyList_Append(key, n_args) == 0
                ? 1
                : -1;
    Py_XDECREF(n_args);
    for (Py_ssize_t i = 0; r == 1 && i < nargs; i++) {
        r = walk_obj(self, args[i], key, dyn, 0);
    }
    if (r == 1 && nkw > 0) {
        Py_ssize_t perm[MAX_KW];
        PyObject *order = kw_order(self, kwnames, perm);
        r = order != NULL && PyList_Append(key, (PyObject *)&PyDict_Type) == 0 &&
                    PyList_Append(key, order) == 0
                ? 1
                : -1;
        Py_XDECREF(order);
        for (Py_ssize_t i = 0; r == 1 && i < nkw; i++) {
            r = walk_obj(self, args[nargs + perm[i]], key, dyn, 0);
        }
    }
    return r;
}

/* The key of a call as a tuple (`*keyt`, a new reference) and its dynamic leaves
 * (`*dyn`, a new list, set whenever the result is not -1): 1 walked, 0 not
 * walkable (`*keyt` NULL), -1 error (both NULL). */
static int call_key_tuple(FastCall *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames, PyObject **keyt, PyObject **dyn) {
    *keyt = NULL;
    *dyn = PyList_New(0);
    PyObject *key = PyList_New(0);
    int r = key && *dyn ? call_key(self, args, nargs, kwnames, key, *dyn) : -1;
    if (r == 1) {
        *keyt = PyList_AsTuple(key);
        if (*keyt == NULL) r = -1;
    }
    Py_XDECREF(key);
    if (r < 0) Py_CLEAR(*dyn);
    return r;
}

/* `entry.jitted` called on the leaves by the convention of `_convention.py`:
 * `(dyn)`, `(fun_dyn, dyn)` or `(fun_dyn, first, rest)` split at `plan.n_first`. */
static PyObject *call_jitted(FastCall *self, PyObject *jitted, PyObject *plan,
                             PyObject *dyn) {
    if (self->fun_dyn == Py_None) {
        PyObject *call_args[1] = {dyn};
        return PyObject_Vectorcall(jitted, call_args, 1, NULL);
    }
    if (!self->split_first) {
        PyObject *call_args[2] = {self->fun_dyn, dyn};
        return PyObject_Vectorcall(jitted, call_args, 2, NULL);
    }
    PyObject *k_obj = read_field(self->plan_n_first, plan);
    Py_ssize_t k = k_obj ? PyLong_AsSsize_t(k_obj) : -1;
    Py_XDECREF(k_obj);
    if (k < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "FastCall: n_first < 0");
        return NULL;
    }
    PyObject *result = NULL;
    PyObject *first = PyList_GetSlice(dyn, 0, k);
    PyObject *rest = PyList_GetSlice(dyn, k, PyList_GET_SIZE(dyn));
    if (first != NULL && rest != NULL) {
        PyObject *call_args[3] = {self->fun_dyn, first, rest};
        result = PyObject_Vectorcall(jitted, call_args, 3, NULL);
    }
    Py_XDECREF(first);
    Py_XDECREF(rest);
    return result;
}

/* After the compiled call raised: `on_error(exc)` undoes what a failed trace left
 * behind and may raise another exception in its place (a failed `error_if`
 * check); otherwise the original exception is restored. */
static void report_error(FastCall *self) {
    PyObject *exc_type, *exc_value, *exc_tb;
    PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
    PyErr_NormalizeException(&exc_type, &exc_value, &exc_tb);
    if (exc_tb != NULL && exc_value != NULL) PyException_SetTraceback(exc_value, exc_tb);
    PyObject *res = exc_value ? PyObject_CallOneArg(self->on_error, exc_value) : NULL;
    Py_XDECREF(res);
    if (res == NULL) {
        Py_XDECREF(exc_type);
        Py_XDECREF(exc_value);
        Py_XDECREF(exc_tb);
    } else {
        PyErr_Restore(exc_type, exc_value, exc_tb);
    }
}

/* `after_trace(after - before, args, kwargs, plan)`: the call traced. 0 or -1. */
static int note_trace(FastCall *self, PyObject *before, PyObject *after,
                      PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      PyObject *plan) {
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *n = PyNumber_Subtract(after, before);
    PyObject *kwargs = n ? PyDict_New() : NULL;
    for (Py_ssize_t i = 0; kwargs != NULL && i < nkw; i++) {
        if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
            Py_CLEAR(kwargs);
        }
    }
    PyObject *argt = kwargs ? PyTuple_New(nargs) : NULL;
    for (Py_ssize_t i = 0; argt != NULL && i < nargs; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(argt, i, args[i]);
    }
    PyObject *res = argt ? PyObject_CallFunctionObjArgs(self->after_trace, n, argt,
                                                        kwargs, plan, NULL)
                         : NULL;
    Py_XDECREF(n);
    Py_XDECREF(kwargs);
    Py_XDECREF(argt);
    Py_XDECREF(res);
    return res == NULL ? -1 : 0;
}

/* The output: `entry.fast_build(result)`, or `entry.output(fun_dyn, dyn, result)`. */
static PyObject *build_output(FastCall *self, PyObject *entry, PyObject *dyn,
                              PyObject *result) {
    PyObject *build = read_field(self->entry_fast_build, entry);
    if (build == NULL) return NULL;
    PyObject *out = NULL;
    if (build != Py_None) {
        out = PyObject_CallOneArg(build, result);
    } else {
        PyObject *fun_dyn = self->fun_dyn == Py_None ? PyList_New(0) : self->fun_dyn;
        if (self->fun_dyn != Py_None) Py_INCREF(fun_dyn);
        if (fun_dyn != NULL) {
            out = PyObject_CallFunctionObjArgs(self->entry_output, entry, fun_dyn, dyn,
                                               result, NULL);
            Py_DECREF(fun_dyn);
        }
    }
    Py_DECREF(build);
    return out;
}

/* Call a warm `(plan, entry)` (`found`, held by the caller) on `dyn`: the compiled
 * call, a retrace noticed, the output built. NULL with an error set, or with none
 * when the entry is busy (cold, or another thread tracing): the caller falls back. */
static PyObject *call_entry(FastCall *self, PyObject *found, PyObject *dyn,
                            PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames) {
    PyObject *plan = PyTuple_GET_ITEM(found, 0);
    PyObject *entry = PyTuple_GET_ITEM(found, 1);
    int busy = field_true(self->entry_cold, entry);
    if (busy == 0) busy = field_true(self->store_tracing, self->store);
    if (busy != 0) return NULL; /* an error is set only when busy < 0 */
    PyObject *out = NULL, *after = NULL, *result = NULL;
    PyObject *jitted = read_field(self->entry_jitted, entry);
    PyObject *before = jitted ? read_field(self->store_traces, self->store) : NULL;
    if (before != NULL) result = call_jitted(self, jitted, plan, dyn);
    if (before != NULL && result == NULL) report_error(self);
    if (result != NULL) after = read_field(self->store_traces, self->store);
    int same = after ? PyObject_RichCompareBool(before, after, Py_EQ) : -1;
    if (same == 1) self->hits++;
    if (same == 1 ||
        (same == 0 && note_trace(self, before, after, args, nargs, kwnames, plan) == 0)) {
        out = build_output(self, entry, dyn, result);
    }
    Py_XDECREF(jitted);
    Py_XDECREF(before);
    Py_XDECREF(after);
    Py_XDECREF(result);
    return out;
}

static PyObject *fastcall_call(FastCall *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (PyDict_GET_SIZE(self->plans) == 0 || nkw > MAX_KW ||
        (nkw > 0 && nargs == 0 && self->first_name != Py_None)) {
        /* the last: the first argument may come by keyword (the Python path
           makes it positional) */
        return fall_back(self, args, nargsf, kwnames);
    }
    PyObject *keyt, *dyn, *found = NULL, *out = NULL;
    int r = call_key_tuple(self, args, nargs, kwnames, &keyt, &dyn);
    if (r == 1) {
        found = PyDict_GetItemWithError(self->plans, keyt);
        if (found == NULL && PyErr_Occurred()) r = -1;
    }
    if (r >= 0 && found != NULL && PyTuple_CheckExact(found) &&
        PyTuple_GET_SIZE(found) == 2) {
        Py_INCREF(found); /* the table may change while Python code runs */
        out = call_entry(self, found, dyn, args, nargs, kwnames);
        Py_DECREF(found);
        if (out == NULL && !PyErr_Occurred()) r = 0; /* busy: fall back */
        else r = -1; /* done (or failed): nothing more to do */
    } else if (r >= 0) {
        r = 0; /* not walkable, or a key not in the table */
    }
    if (r == 0) out = fall_back(self, args, nargsf, kwnames);
    Py_XDECREF(dyn);
    Py_XDECREF(keyt);
    return out;
}

/* `FastCall._key(*args, **kwargs)`: `(key, dyn)` as the warm path computes them,
 * or None where it hands the call to Python unwalked; for tests that the key is
 * the Python `_flat_cache.call_key`'s. */
static PyObject *fastcall_key(FastCall *self, PyObject *const *args, Py_ssize_t nargsf,
                              PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > MAX_KW) Py_RETURN_NONE;
    PyObject *keyt, *dyn;
    int r = call_key_tuple(self, args, nargs, kwnames, &keyt, &dyn);
    PyObject *out = r < 0 ? NULL : r == 0 ? Py_NewRef(Py_None) : PyTuple_Pack(2, keyt, dyn);
    Py_XDECREF(keyt);
    Py_XDECREF(dyn);
    return out;
}

/* A function that reads watched names (`watch` is not None): when each name is
 * bound to the very object of the snapshot (`watch.<snap>`: the values, then the
 * hidden argument), call as above with the hidden argument first; otherwise hand
 * the call to the Python capture layer (`watch_fallback`), which reads the names,
 * warns about changed trace-time constants and takes a new snapshot. The twin of
 * `_capture.make_call`'s generated function. */
#define WATCH_STACK 16
static PyObject *fastcall_vectorcall(PyObject *callable, PyObject *const *args,
                                     size_t nargsf, PyObject *kwnames) {
    FastCall *self = (FastCall *)callable;
    if (self->watch == Py_None) return fastcall_call(self, args, nargsf, kwnames);
    Py_ssize_t n = PyTuple_GET_SIZE(self->watch_sources);
    PyObject *snap = read_field(self->watch_snap, self->watch);
    if (snap == NULL) return NULL;
    int same = PyTuple_CheckExact(snap) && PyTuple_GET_SIZE(snap) == n + 1;
    for (Py_ssize_t i = 0; same && i < n; i++) {
        PyObject *source = PyTuple_GET_ITEM(self->watch_sources, i);
        PyObject *name = PyTuple_GET_ITEM(self->watch_keys, i);
        PyObject *now;
        if (name == Py_None) {
            now = PyCell_GET(source);
        } else {
            now = PyDict_GetItemWithError(source, name);
            if (now == NULL && PyErr_Occurred()) {
                Py_DECREF(snap);
                return NULL;
            }
        }
        same = now != NULL && now == PyTuple_GET_ITEM(snap, i);
    }
    if (!same) {
        Py_DECREF(snap);
        return PyObject_Vectorcall(self->watch_fallback, args, nargsf, kwnames);
    }
    if (!self->watch_hidden) {
        Py_DECREF(snap);
        return fastcall_call(self, args, nargsf, kwnames);
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t total = nargs + (kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames));
    PyObject *stack[WATCH_STACK];
    PyObject **full = total < WATCH_STACK ? stack : PyMem_New(PyObject *, total + 1);
    if (full == NULL) {
        Py_DECREF(snap);
        return PyErr_NoMemory();
    }
    full[0] = PyTuple_GET_ITEM(snap, n); /* the hidden argument (snap holds it) */
    if (total > 0) memcpy(full + 1, args, total * sizeof(PyObject *));
    PyObject *out = fastcall_call(self, full, (size_t)(nargs + 1), kwnames);
    if (full != stack) PyMem_Free(full);
    Py_DECREF(snap);
    return out;
}

/* Whether `sources` and `keys` (tuples) describe watched names: of the same length,
 * each pair a dict and a str (a global) or a cell and None (a closure variable). */
static int valid_watch_pairs(PyObject *sources, PyObject *keys) {
    Py_ssize_t n = PyTuple_GET_SIZE(sources);
    if (PyTuple_GET_SIZE(keys) != n) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *source = PyTuple_GET_ITEM(sources, i);
        PyObject *name = PyTuple_GET_ITEM(keys, i);
        int ok = name == Py_None ? PyCell_Check(source)
                                 : PyDict_CheckExact(source) && PyUnicode_CheckExact(name);
        if (!ok) return 0;
    }
    return 1;
}

static PyObject *fastcall_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"fallback", "plans", "store", "walk", "after_trace",
                            "on_error", "array_type", "array_token", "none_token",
                            "module_types", "walkable", "fun_dyn", "split_first",
                            "first_name", "flat_key", "entry_cold", "entry_jitted",
                            "entry_fast_build", "entry_output", "plan_n_first",
                            "store_traces", "store_tracing", "name", "watch",
                            "watch_snap", "watch_sources", "watch_keys",
                            "watch_fallback", "key_type", "key_token",
                            "watch_hidden", NULL};
    PyObject *fallback, *plans, *store, *walk, *after_trace, *on_error, *array_type,
        *array_token, *none_token, *module_types, *walkable, *fun_dyn;
    PyObject *first_name, *flat_key, *entry_cold, *entry_jitted, *entry_fast_build,
        *entry_output, *plan_n_first, *store_traces, *store_tracing, *name;
    PyObject *watch = Py_None, *watch_snap = Py_None, *watch_sources = NULL,
             *watch_keys = NULL, *watch_fallback = Py_None;
    PyObject *key_type = Py_None, *key_token = Py_None;
    int split_first, watch_hidden = 1;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "OO!OOOOOOOO!O!OpOUOOOOOOOU|OOO!O!OOOp:FastCall", names, &fallback, &PyDict_Type,
            &plans, &store, &walk, &after_trace, &on_error, &array_type, &array_token,
            &none_token, &PySet_Type, &module_types, &PyDict_Type, &walkable,
            &fun_dyn, &split_first, &first_name, &flat_key, &entry_cold, &entry_jitted,
            &entry_fast_build, &entry_output, &plan_n_first, &store_traces,
            &store_tracing, &name, &watch, &watch_snap, &PyTuple_Type, &watch_sources,
            &PyTuple_Type, &watch_keys, &watch_fallback, &key_type, &key_token,
            &watch_hidden)) {
        return NULL;
    }
    if (watch != Py_None) {
        int ok = watch_sources != NULL && watch_keys != NULL &&
                 Py_TYPE(watch_snap)->tp_descr_get != NULL &&
                 PyCallable_Check(watch_fallback) &&
                 valid_watch_pairs(watch_sources, watch_keys);
        if (!ok) {
            PyErr_SetString(PyExc_TypeError,
                            "FastCall: watch needs watch_snap (a descriptor), "
                            "watch_sources and watch_keys (tuples of the same length: "
                            "a dict and a str, or a cell and None, each) and a callable "
                            "watch_fallback");
            return NULL;
        }
    } else {
        watch_sources = watch_keys = empty_tuple;
    }
    PyObject *fields[] = {entry_cold, entry_jitted, entry_fast_build, plan_n_first,
                          store_traces, store_tracing};
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (Py_TYPE(fields[i])->tp_descr_get == NULL) {
            PyErr_SetString(PyExc_TypeError,
                            "FastCall: fields must be descriptors (e.g. Cls.slot)");
            return NULL;
        }
    }
    if (fun_dyn != Py_None && !PyList_CheckExact(fun_dyn)) {
        PyErr_SetString(PyExc_TypeError, "FastCall: fun_dyn must be a list or None");
        return NULL;
    }
    FastCall *self = (FastCall *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    self->vectorcall = fastcall_vectorcall;
#define KEEP(field) Py_INCREF(field); self->field = field
    KEEP(fallback); KEEP(plans); KEEP(store); KEEP(walk); KEEP(after_trace);
    KEEP(on_error);
    KEEP(array_type); KEEP(array_token); KEEP(key_type); KEEP(key_token);
    KEEP(none_token); KEEP(module_types);
    KEEP(walkable); KEEP(fun_dyn); KEEP(first_name); KEEP(flat_key);
    KEEP(entry_cold); KEEP(entry_jitted); KEEP(entry_fast_build); KEEP(entry_output);
    KEEP(plan_n_first); KEEP(store_traces); KEEP(store_tracing); KEEP(name);
    KEEP(watch); KEEP(watch_snap); KEEP(watch_sources); KEEP(watch_keys);
    KEEP(watch_fallback);
#undef KEEP
    self->kw_names = NULL;
    self->kw_order = NULL;
    self->split_first = split_first;
    self->watch_hidden = watch_hidden;
    self->hits = 0;
    return (PyObject *)self;
}

/* every object a FastCall holds, for the garbage collector */
#define FASTCALL_OBJECTS(X)                                                        \
    X(dict) X(fallback) X(plans) X(store) X(walk) X(after_trace) X(on_error)       \
    X(array_type) X(key_type) X(key_token)                                         \
    X(array_token) X(none_token) X(module_types) X(walkable) X(fun_dyn)         \
    X(first_name) X(kw_names) X(kw_order) X(flat_key) X(entry_cold)              \
    X(entry_jitted) X(entry_fast_build) X(entry_output) X(plan_n_first)          \
    X(store_traces) X(store_tracing) X(name) X(watch) X(watch_snap)               \
    X(watch_sources) X(watch_keys) X(watch_fallback)

static int fastcall_traverse(FastCall *self, visitproc visit, void *arg) {
#define VISIT(field) Py_VISIT(self->field);
    FASTCALL_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int fastcall_clear(FastCall *self) {
#define CLEAR(field) Py_CLEAR(self->field);
    FASTCALL_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void fastcall_dealloc(FastCall *self) {
    PyObject_GC_UnTrack(self);
    if (self->weaklist != NULL) PyObject_ClearWeakRefs((PyObject *)self);
    fastcall_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Bind like a function when used as a class attribute. */
static PyObject *fastcall_get(PyObject *self, PyObject *obj, PyObject *type) {
    if (obj == NULL || obj == Py_None) {
        Py_INCREF(self);
        return self;
    }
    return PyMethod_New(self, obj);
}

static PyObject *fastcall_repr(PyObject *self) {
    return PyUnicode_FromFormat("<function %U at %p>", ((FastCall *)self)->name, self);
}

/* `_rewatch(sources, keys)`: read the watched names from here on (the capture
 * layer scanned again: a helper defined after the function was wrapped reads more
 * names). The snapshot's length changes with them, so a call that sees the old
 * snapshot goes to the fallback. */
static PyObject *fastcall_rewatch(FastCall *self, PyObject *args) {
    PyObject *sources, *keys;
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &sources, &PyTuple_Type, &keys))
        return NULL;
    int ok = self->watch != Py_None && valid_watch_pairs(sources, keys);
    if (!ok) {
        PyErr_SetString(PyExc_TypeError,
                        "FastCall._rewatch: a watching FastCall and two tuples of the "
                        "same length (a dict and a str, or a cell and None, each)");
        return NULL;
    }
    Py_INCREF(sources);
    Py_INCREF(keys);
    Py_SETREF(self->watch_sources, sources);
    Py_SETREF(self->watch_keys, keys);
    Py_RETURN_NONE;
}

static PyMethodDef fastcall_methods[] = {
    {"_key", (PyCFunction)(void (*)(void))fastcall_key, METH_FASTCALL | METH_KEYWORDS,
     "`(key, dyn)` of a call as the warm path walks it; None where it does not."},
    {"_rewatch", (PyCFunction)fastcall_rewatch, METH_VARARGS,
     "read the watched names from these sources and keys from now on"},
    {NULL}};

static PyMemberDef fastcall_members[] = {
    {"hits", T_PYSSIZET, offsetof(FastCall, hits), 0,
     "calls that ran compiled code on the C path"},
    {NULL}};

static PyGetSetDef fastcall_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict},
    {NULL}};

static PyTypeObject FastCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "boxwood._native._speedups.FastCall",
    .tp_doc = "A `filter_jit` function whose warm calls run in C.",
    .tp_basicsize = sizeof(FastCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC |
                Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = fastcall_new,
    .tp_dealloc = (destructor)fastcall_dealloc,
    .tp_traverse = (traverseproc)fastcall_traverse,
    .tp_clear = (inquiry)fastcall_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(FastCall, vectorcall),
    .tp_dictoffset = offsetof(FastCall, dict),
    .tp_weaklistoffset = offsetof(FastCall, weaklist),
    .tp_descr_get = fastcall_get,
    .tp_repr = fastcall_repr,
    .tp_members = fastcall_members,
    .tp_methods = fastcall_methods,
    .tp_getset = fastcall_getset,
};

/* ------------------------------------------------------------------ Builder
 *
 * `Builder(program)(leaves)` builds a `filter_jit` output from its leaf list. The
 * program is a tree of tuples made by `_jit/_rebuild.py` (`_Emitter`), each starting
 * with an opcode; the same program is turned into Python source where this
 * extension is not built, so both build exactly the same objects.
 */
/* What a node does. The opcodes that stand for these in a program are numbered in
 * `_jit/_rebuild.py` (the one definition) and handed to each Builder when it is built;
 * `handler[opcode]` maps them to these. */
enum {
    K_NONE = 0,  /* an opcode with no handler */
    K_LEAF,   /* (op, i): leaves[i] */
    K_CONST,  /* (op, value) */
    K_LIST,   /* (op, children) */
    K_TUPLE,  /* (op, children) */
    K_NTUPLE, /* (op, cls, children): a NamedTuple (tuple subclass) */
    K_DICT,   /* (op, keys, children) */
    K_MODULE, /* (op, cls, names, children, statics): instance dict of
                 {names[i]: child i} then the static fields */
    K_LAZY,   /* (op, cls, statics, token, start, stop): static fields and
                 the flat form (token, leaves[start:stop]) */
    K_CALL,   /* (op, fn, children): fn([child, ...]) (other node types) */
};
#define MAX_OP 64

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *program;
    PyObject *flat_key;              /* the instance-dict key of a flat form */
    unsigned char handler[MAX_OP];   /* opcode -> K_* */
} Builder;

static PyObject *empty_tuple;

static PyObject *run_node(Builder *b, PyObject *node, PyObject *leaves, int depth);

/* Build each child node (a tuple of nodes) into the new list or tuple `out`, of the
 * same length; `out` is released on error. */
static PyObject *fill(Builder *b, PyObject *out, PyObject *children, PyObject *leaves,
                      int depth) {
    if (out == NULL) return NULL;
    PyObject **items = PySequence_Fast_ITEMS(out); /* a list's or a tuple's */
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(children); i++) {
        PyObject *v = run_node(b, PyTuple_GET_ITEM(children, i), leaves, depth + 1);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        items[i] = v;
    }
    return out;
}

/* children -> a new list of built objects */
static PyObject *run_children(Builder *b, PyObject *children, PyObject *leaves,
                              int depth) {
    return fill(b, PyList_New(PyTuple_GET_SIZE(children)), children, leaves, depth);
}

/* children -> a new tuple of type `type` (a NamedTuple is a tuple subclass: its
 * instances are allocated the same way, as `tuple.__new__(cls, items)` does) */
static PyObject *run_tuple(Builder *b, PyTypeObject *type, PyObject *children,
                           PyObject *leaves, int depth) {
    Py_ssize_t n = PyTuple_GET_SIZE(children);
    PyObject *out = type == &PyTuple_Type ? PyTuple_New(n) : type->tp_alloc(type, n);
    return fill(b, out, children, leaves, depth);
}

/* children -> a new dict mapping `keys[i]` to the built child `i` */
static PyObject *run_dict(Builder *b, PyObject *keys, PyObject *children,
                          PyObject *leaves, int depth) {
    PyObject *items = run_children(b, children, leaves, depth);
    if (items == NULL) return NULL;
    PyObject *d = PyDict_New();
    for (Py_ssize_t i = 0; d != NULL && i < PyList_GET_SIZE(items); i++) {
        if (PyDict_SetItem(d, PyTuple_GET_ITEM(keys, i), PyList_GET_ITEM(items, i)) < 0) {
            Py_CLEAR(d);
        }
    }
    Py_DECREF(items);
    return d;
}

/* a new instance of `cls` (as `object.__new__(cls)`) whose `__dict__` is `values` */
static PyObject *new_with_dict(PyObject *cls, PyObject *values) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "Builder: module class expected");
        return NULL;
    }
    PyObject *obj = PyBaseObject_Type.tp_new((PyTypeObject *)cls, empty_tuple, NULL);
    if (obj == NULL) return NULL;
    if (PyObject_GenericSetDict(obj, values, NULL) < 0) {
        Py_DECREF(obj);
        return NULL;
    }
    return obj;
}

static PyObject *run_node(Builder *b, PyObject *node, PyObject *leaves, int depth) {
    if (depth > 200) {
        PyErr_SetString(PyExc_RecursionError, "Builder: output tree too deep");
        return NULL;
    }
    if (!PyTuple_Check(node) || PyTuple_GET_SIZE(node) < 2) {
        PyErr_SetString(PyExc_TypeError, "Builder: malformed program");
        return NULL;
    }
    long op = PyLong_AsLong(PyTuple_GET_ITEM(node, 0));
    Py_ssize_t size = PyTuple_GET_SIZE(node);
    switch (op >= 0 && op < MAX_OP ? b->handler[op] : K_NONE) {
    case K_LEAF: {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(node, 1));
        if (i < 0 && PyErr_Occurred()) return NULL;
        PyObject *v = PyList_GetItem(leaves, i);
        Py_XINCREF(v);
        return v;
    }
    case K_CONST: {
        PyObject *v = PyTuple_GET_ITEM(node, 1);
        Py_INCREF(v);
        return v;
    }
    case K_LIST:
        return run_children(b, PyTuple_GET_ITEM(node, 1), leaves, depth);
    case K_TUPLE:
        return run_tuple(b, &PyTuple_Type, PyTuple_GET_ITEM(node, 1), leaves, depth);
    case K_NTUPLE: {
        if (size < 3) break;
        PyObject *cls = PyTuple_GET_ITEM(node, 1);
        if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
            break;
        }
        return run_tuple(b, (PyTypeObject *)cls, PyTuple_GET_ITEM(node, 2), leaves, depth);
    }
    case K_DICT:
        if (size < 3) break;
        return run_dict(b, PyTuple_GET_ITEM(node, 1), PyTuple_GET_ITEM(node, 2), leaves,
                        depth);
    case K_MODULE: {
        if (size < 5) break;
        PyObject *names = PyTuple_GET_ITEM(node, 2);
        PyObject *statics = PyTuple_GET_ITEM(node, 4);
        PyObject *d = run_dict(b, names, PyTuple_GET_ITEM(node, 3), leaves, depth);
        if (d == NULL || PyDict_Update(d, statics) < 0) {
            Py_XDECREF(d);
            return NULL;
        }
        PyObject *obj = new_with_dict(PyTuple_GET_ITEM(node, 1), d);
        Py_DECREF(d);
        return obj;
    }
    case K_LAZY: {
        if (size < 6) break;
        Py_ssize_t start = PyLong_AsSsize_t(PyTuple_GET_ITEM(node, 4));
        Py_ssize_t stop = PyLong_AsSsize_t(PyTuple_GET_ITEM(node, 5));
        if ((start < 0 || stop < 0) && PyErr_Occurred()) return NULL;
        PyObject *d = PyDict_Copy(PyTuple_GET_ITEM(node, 2));
        if (d == NULL) return NULL;
        PyObject *part = PyList_GetSlice(leaves, start, stop);
        PyObject *record = part ? PyTuple_Pack(2, PyTuple_GET_ITEM(node, 3), part)
                                : NULL;
        Py_XDECREF(part);
        if (record == NULL || PyDict_SetItem(d, b->flat_key, record) < 0) {
            Py_XDECREF(record);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(record);
        PyObject *obj = new_with_dict(PyTuple_GET_ITEM(node, 1), d);
        Py_DECREF(d);
        return obj;
    }
    case K_CALL: {
        if (size < 3) break;
        PyObject *items = run_children(b, PyTuple_GET_ITEM(node, 2), leaves, depth);
        if (items == NULL) return NULL;
        PyObject *v = PyObject_CallOneArg(PyTuple_GET_ITEM(node, 1), items);
        Py_DECREF(items);
        return v;
    }
    default:
        if (op == -1 && PyErr_Occurred()) return NULL;
    }
    PyErr_Format(PyExc_TypeError, "Builder: malformed program node (opcode %ld)", op);
    return NULL;
}

static PyObject *builder_vectorcall(PyObject *callable, PyObject *const *args,
                                    size_t nargsf, PyObject *kwnames) {
    if (PyVectorcall_NARGS(nargsf) != 1 ||
        (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0)) {
        PyErr_SetString(PyExc_TypeError, "Builder takes one argument (the leaves)");
        return NULL;
    }
    if (!PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "Builder: the leaves must be a list");
        return NULL;
    }
    Builder *b = (Builder *)callable;
    return run_node(b, b->program, args[0], 0);
}

static PyObject *builder_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    /* the opcode of each node kind, numbered by `_jit/_rebuild.py` */
    static char *names[] = {"program", "flat_key", "leaf", "const", "list", "tuple",
                            "ntuple", "dict", "module", "lazy", "call", NULL};
    PyObject *program, *flat_key;
    int ops[9];
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O$iiiiiiiii:Builder", names,
                                     &PyTuple_Type, &program, &flat_key, &ops[0],
                                     &ops[1], &ops[2], &ops[3], &ops[4], &ops[5],
                                     &ops[6], &ops[7], &ops[8])) {
        return NULL;
    }
    Builder *self = (Builder *)type->tp_alloc(type, 0);
    if (self == NULL) return NULL;
    memset(self->handler, K_NONE, sizeof(self->handler));
    for (int k = 0; k < 9; k++) {
        if (ops[k] < 0 || ops[k] >= MAX_OP || self->handler[ops[k]] != K_NONE) {
            Py_DECREF(self);
            PyErr_SetString(PyExc_ValueError,
                            "Builder: opcodes must be distinct, in [0, 64)");
            return NULL;
        }
        self->handler[ops[k]] = (unsigned char)(K_LEAF + k);
    }
    self->vectorcall = builder_vectorcall;
    Py_INCREF(program);
    self->program = program;
    Py_INCREF(flat_key);
    self->flat_key = flat_key;
    return (PyObject *)self;
}

static int builder_traverse(Builder *self, visitproc visit, void *arg) {
    Py_VISIT(self->program);
    Py_VISIT(self->flat_key);
    return 0;
}

static int builder_clear(Builder *self) {
    Py_CLEAR(self->program);
    Py_CLEAR(self->flat_key);
    return 0;
}

static void builder_dealloc(Builder *self) {
    PyObject_GC_UnTrack(self);
    builder_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef builder_members[] = {
    {"program", T_OBJECT, offsetof(Builder, program), READONLY,
     "the program this builder runs"},
    {NULL}};

static PyTypeObject BuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "boxwood._native._speedups.Builder",
    .tp_doc = "Builds a `filter_jit` output from its leaves (see `_jit/_rebuild.py`).",
    .tp_basicsize = sizeof(Builder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = builder_new,
    .tp_dealloc = (destructor)builder_dealloc,
    .tp_traverse = (traverseproc)builder_traverse,
    .tp_clear = (inquiry)builder_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Builder, vectorcall),
    .tp_members = builder_members,
};

/* ------------------------------------------------------------ install_call
 *
 * JAX's C++ unflatten rebuilds a module with `cls(**fields, _boxwood_rebuild=key)`,
 * where `key` is the module's static key (of type `_static_key.StaticKey`). The
 * metaclass's Python `__call__` (`_module._ModuleMeta`) recognises the key by its
 * type and makes the keywords the instance dict, without calling `__init__`.
 * `install_call(meta, name, marker_type, slotted)` gives the metaclass a C
 * `tp_call` slot that does the same before any Python runs: it receives JAX's
 * keyword dict as it is, and a copy of it becomes the instance dict of a bare
 * instance. Every other call (a user constructing a module, a rebuild of a class
 * in the set `slotted`) goes to the slot the metaclass had, which calls its Python
 * `__call__`. `install_call(meta, None, None, None)` puts that slot back.
 */
static PyObject *rebuild_name, *rebuild_marker, *rebuild_slotted; /* marker: a type */
static ternaryfunc generic_call; /* the metaclass's own slot (CPython's `slot_tp_call`) */
static PyObject *rebuild_meta;    /* the one metaclass installed */

static PyObject *rebuild_tp_call(PyObject *cls, PyObject *args, PyObject *kwds) {
    if (kwds != NULL && PyTuple_GET_SIZE(args) == 0) {
        PyObject *mark = PyDict_GetItemWithError(kwds, rebuild_name);
        if (mark != NULL && (PyObject *)Py_TYPE(mark) == rebuild_marker) {
            int slotted = PySet_GET_SIZE(rebuild_slotted) ? PySet_Contains(rebuild_slotted, cls) : 0;
            if (slotted < 0) return NULL;
            if (!slotted) {
                PyTypeObject *type = (PyTypeObject *)cls;
                PyObject *obj = type->tp_alloc(type, 0);
                if (obj == NULL) return NULL;
                PyObject *values = PyDict_Copy(kwds);
                if (values == NULL || PyObject_GenericSetDict(obj, values, NULL) < 0) {
                    Py_XDECREF(values);
                    Py_DECREF(obj);
                    return NULL;
                }
                Py_DECREF(values);
                return obj;
            }
        }
        if (mark == NULL && PyErr_Occurred()) return NULL;
    }
    return generic_call(cls, args, kwds);
}

static PyObject *install_call(PyObject *module, PyObject *args) {
    PyObject *meta, *name, *marker, *slotted;
    if (!PyArg_ParseTuple(args, "O!OOO:install_call", &PyType_Type, &meta, &name,
                          &marker, &slotted)) {
        return NULL;
    }
    PyTypeObject *type = (PyTypeObject *)meta;
    if (!PyType_HasFeature(type, Py_TPFLAGS_HEAPTYPE) || !PyType_IsSubtype(type, &PyType_Type)) {
        PyErr_SetString(PyExc_TypeError, "install_call: a metaclass defined in Python expected");
        return NULL;
    }
    if (name == Py_None) { /* back to the metaclass's own slot */
        if (type->tp_call == rebuild_tp_call) type->tp_call = generic_call;
        Py_RETURN_NONE;
    }
    if (!PyUnicode_Check(name) || !PyType_Check(marker) || !PySet_Check(slotted)) {
        PyErr_SetString(PyExc_TypeError, "install_call(meta, str, type, set) expected");
        return NULL;
    }
    if (type->tp_call == rebuild_tp_call) Py_RETURN_NONE; /* installed already */
    if (type->tp_call == PyType_Type.tp_call || type->tp_call == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "install_call: the metaclass's __call__ must be defined in Python");
        return NULL;
    }
    if (rebuild_meta != NULL && rebuild_meta != meta) {
        PyErr_SetString(PyExc_ValueError, "install_call: one metaclass only");
        return NULL;
    }
    Py_INCREF(name);
    PyUnicode_InternInPlace(&name);
    Py_XSETREF(rebuild_name, name);
    Py_INCREF(marker);
    Py_XSETREF(rebuild_marker, marker);
    Py_INCREF(slotted);
    Py_XSETREF(rebuild_slotted, slotted);
    generic_call = type->tp_call;
    Py_INCREF(meta);
    Py_XSETREF(rebuild_meta, meta);
    type->tp_call = rebuild_tp_call;
    Py_RETURN_NONE;
}

static PyMethodDef speedups_methods[] = {
    {"install_call", install_call, METH_VARARGS,
     "install_call(meta, name, marker_type, slotted): rebuild modules from JAX's "
     "keywords in C (`name=None`: remove)."},
    {NULL}};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "boxwood._native._speedups",
    .m_doc = "The warm-call path of `filter_jit`, in C (see `_jit/_wrapper.py`).",
    .m_size = -1,
    .m_methods = speedups_methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    if ((empty_tuple = PyTuple_New(0)) == NULL) return NULL;
    if (PyType_Ready(&FastCallType) < 0 || PyType_Ready(&BuilderType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL) return NULL;
    Py_INCREF(&FastCallType);
    if (PyModule_AddObject(m, "FastCall", (PyObject *)&FastCallType) < 0) {
        Py_DECREF(&FastCallType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&BuilderType);
    if (PyModule_AddObject(m, "Builder", (PyObject *)&BuilderType) < 0) {
        Py_DECREF(&BuilderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
