/* Generated from graphsvc/ops/opmath.py by `python -m graphsvc.ops.opmath`: do not edit (the table is the
 * source; tests/ops/test_opmath.py checks this file against it).
 *
 * opmath_forward(code, x, y, p) and opmath_partials(code, x, y, out, p, &dx, &dy) of every builtin
 * elementwise op, by its code (graphsvc.ops.opmath.PRIMITIVES: position + 1). Unary ops ignore y (and
 * dy); p is the op's one attribute (pow's exponent), else ignored. Compile with -ffp-contract=off:
 * each operation rounds as it does in numpy and in Python. */
#ifndef GRAPHSVC_OPMATH_H
#define GRAPHSVC_OPMATH_H

#include <math.h>

/* Inlined into each sweep's loop: a call per node costs as much as the node's arithmetic. */
#if defined(__GNUC__)
#define OPMATH_INLINE static inline __attribute__((always_inline))
#else
#define OPMATH_INLINE static inline
#endif

#define OPMATH_DIGEST "4ace7c9e"
#define OPMATH_COUNT 17

enum {
    OPMATH_ADD = 1,
    OPMATH_SUB = 2,
    OPMATH_MUL = 3,
    OPMATH_DIV = 4,
    OPMATH_NEG = 5,
    OPMATH_POW = 6,
    OPMATH_EXP = 7,
    OPMATH_LOG = 8,
    OPMATH_SQRT = 9,
    OPMATH_SIN = 10,
    OPMATH_COS = 11,
    OPMATH_TANH = 12,
    OPMATH_RELU = 13,
    OPMATH_SIGMOID = 14,
    OPMATH_ABS = 15,
    OPMATH_MAX = 16,
    OPMATH_MIN = 17,
};

/* The words of the rule language. */
OPMATH_INLINE double opmath_div(double a, double b) { return a / b; }
OPMATH_INLINE double opmath_sqrt(double a) { return sqrt(a); }
OPMATH_INLINE double opmath_maximum(double a, double b) { return (a > b || a != a) ? a : b; }
OPMATH_INLINE double opmath_minimum(double a, double b) { return (a < b || a != a) ? a : b; }
OPMATH_INLINE double opmath_fabs(double a) { return fabs(a); }
OPMATH_INLINE double opmath_sign(double a) { return a > 0.0 ? 1.0 : (a < 0.0 ? -1.0 : (a == 0.0 ? 0.0 : a)); }
OPMATH_INLINE double opmath_gt(double a, double b) { return a > b ? 1.0 : 0.0; }
OPMATH_INLINE double opmath_lt(double a, double b) { return a < b ? 1.0 : 0.0; }
OPMATH_INLINE double opmath_eq(double a, double b) { return a == b ? 1.0 : 0.0; }
OPMATH_INLINE double opmath_exp(double a) { return exp(a); }
OPMATH_INLINE double opmath_log(double a) { return log(a); }
OPMATH_INLINE double opmath_pow(double a, double b) { return b == 2.0 ? a * a : pow(a, b); }
OPMATH_INLINE double opmath_sin(double a) { return sin(a); }
OPMATH_INLINE double opmath_cos(double a) { return cos(a); }
OPMATH_INLINE double opmath_tanh(double a) { return tanh(a); }

/* 1 for an op whose nodes carry a parameter p (an attribute), else 0. */
OPMATH_INLINE int opmath_takes_param(int code) {
    switch (code) {
    case OPMATH_POW:
        return 1;
    default:
        return 0;
    }
}

/* An op's output (nan for a code that is no op). */
OPMATH_INLINE double opmath_forward(int code, double x, double y, double p) {
    (void)y;
    (void)p;
    switch (code) {
    case OPMATH_ADD: return (x + y); /* x + y */
    case OPMATH_SUB: return (x - y); /* x - y */
    case OPMATH_MUL: return (x * y); /* x * y */
    case OPMATH_DIV: return opmath_div(x, y); /* div(x, y) */
    case OPMATH_NEG: return (-x); /* -x */
    case OPMATH_POW: return opmath_pow(x, p); /* pow(x, exponent) */
    case OPMATH_EXP: return opmath_exp(x); /* exp(x) */
    case OPMATH_LOG: return opmath_log(x); /* log(x) */
    case OPMATH_SQRT: return opmath_sqrt(x); /* sqrt(x) */
    case OPMATH_SIN: return opmath_sin(x); /* sin(x) */
    case OPMATH_COS: return opmath_cos(x); /* cos(x) */
    case OPMATH_TANH: return opmath_tanh(x); /* tanh(x) */
    case OPMATH_RELU: return opmath_maximum(x, 0.0); /* maximum(x, 0) */
    case OPMATH_SIGMOID: return opmath_div(1.0, (1.0 + opmath_exp((-x)))); /* div(1, 1 + exp(-x)) */
    case OPMATH_ABS: return opmath_fabs(x); /* fabs(x) */
    case OPMATH_MAX: return opmath_maximum(x, y); /* maximum(x, y) */
    case OPMATH_MIN: return opmath_minimum(x, y); /* minimum(x, y) */
    default: return NAN;
    }
}

/* An op's (d out/d x, d out/d y); dy is 0 for a unary op. */
OPMATH_INLINE void opmath_partials(int code, double x, double y, double out, double p, double *dx,
                                   double *dy) {
    (void)y;
    (void)out;
    (void)p;
    switch (code) {
    case OPMATH_ADD: /* 1, 1 */
        *dx = 1.0;
        *dy = 1.0;
        return;
    case OPMATH_SUB: /* 1, -1 */
        *dx = 1.0;
        *dy = (-1.0);
        return;
    case OPMATH_MUL: /* y, x */
        *dx = y;
        *dy = x;
        return;
    case OPMATH_DIV: /* div(1, y), div(-out, y) */
        *dx = opmath_div(1.0, y);
        *dy = opmath_div((-out), y);
        return;
    case OPMATH_NEG: /* -1 */
        *dx = (-1.0);
        *dy = 0.0;
        return;
    case OPMATH_POW: /* exponent * pow(x, exponent - 1) */
        *dx = (p * opmath_pow(x, (p - 1.0)));
        *dy = 0.0;
        return;
    case OPMATH_EXP: /* out */
        *dx = out;
        *dy = 0.0;
        return;
    case OPMATH_LOG: /* div(1, x) */
        *dx = opmath_div(1.0, x);
        *dy = 0.0;
        return;
    case OPMATH_SQRT: /* div(0.5, out) */
        *dx = opmath_div(0.5, out);
        *dy = 0.0;
        return;
    case OPMATH_SIN: /* cos(x) */
        *dx = opmath_cos(x);
        *dy = 0.0;
        return;
    case OPMATH_COS: /* -sin(x) */
        *dx = (-opmath_sin(x));
        *dy = 0.0;
        return;
    case OPMATH_TANH: /* 1 - out * out */
        *dx = (1.0 - (out * out));
        *dy = 0.0;
        return;
    case OPMATH_RELU: /* gt(out, 0) */
        *dx = opmath_gt(out, 0.0);
        *dy = 0.0;
        return;
    case OPMATH_SIGMOID: /* out * (1 - out) */
        *dx = (out * (1.0 - out));
        *dy = 0.0;
        return;
    case OPMATH_ABS: /* sign(x) */
        *dx = opmath_sign(x);
        *dy = 0.0;
        return;
    case OPMATH_MAX: /* gt(x, y) + 0.5 * eq(x, y), gt(y, x) + 0.5 * eq(x, y) */
        *dx = (opmath_gt(x, y) + (0.5 * opmath_eq(x, y)));
        *dy = (opmath_gt(y, x) + (0.5 * opmath_eq(x, y)));
        return;
    case OPMATH_MIN: /* lt(x, y) + 0.5 * eq(x, y), lt(y, x) + 0.5 * eq(x, y) */
        *dx = (opmath_lt(x, y) + (0.5 * opmath_eq(x, y)));
        *dy = (opmath_lt(y, x) + (0.5 * opmath_eq(x, y)));
        return;
    default: *dx = NAN; *dy = NAN; return;
    }
}

#endif
