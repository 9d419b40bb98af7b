/* Stub: helpers.h includes it for socket programs only. */
