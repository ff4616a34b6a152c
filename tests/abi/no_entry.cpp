// A shared library that is not a qrun plugin: it has no entry point.
extern "C" __attribute__((visibility("default"))) int not_a_plugin(void) { return 42; }
