/* tests/capi_test.c: libdevmem.so's C ABI from C, compiled as C99 with -pedantic
 * -Werror so that capi/devmem.h is checked to be valid C.
 *
 *   devmem_capi_test            the API on a 64 MiB sim device (ctest sets DEVMEM_CONF
 *                               to backend:sim,sim_capacity:64MiB): alloc, free, double
 *                               free naming the pointer, bad arguments, streams, an OOM
 *                               whose report names the pushed tags, JSON, the PyTorch-
 *                               and CuPy-style entry points, per-thread state
 *   devmem_capi_test --bad-conf DEVMEM_CONF is malformed: every call says
 *                               DEVMEM_ERR_CONFIG and names the key
 *
 * Prints "N passed, N failed" and exits non-zero on any failure. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capi/devmem.h"

static int g_passed = 0;
static int g_failed = 0;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (cond) {                                                                  \
      ++g_passed;                                                                \
    } else {                                                                     \
      ++g_failed;                                                                \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n  last error: %s\n", __FILE__,   \
              __LINE__, #cond, devmem_last_error());                             \
    }                                                                            \
  } while (0)

#define MiB ((size_t)1 << 20)

static int contains(const char* haystack, const char* needle) {
  return haystack != NULL && strstr(haystack, needle) != NULL;
}

static void test_names(void) {
  CHECK(strcmp(devmem_error_name(DEVMEM_OK), "DEVMEM_OK") == 0);
  CHECK(strcmp(devmem_error_name(DEVMEM_ERR_OOM), "DEVMEM_ERR_OOM") == 0);
  CHECK(strcmp(devmem_error_name(DEVMEM_ERR_INVALID), "DEVMEM_ERR_INVALID") == 0);
  CHECK(strcmp(devmem_error_name(DEVMEM_ERR_CONFIG), "DEVMEM_ERR_CONFIG") == 0);
  CHECK(strcmp(devmem_error_name(DEVMEM_ERR_INTERNAL), "DEVMEM_ERR_INTERNAL") == 0);
  CHECK(strcmp(devmem_error_name(42), "unknown") == 0);
  CHECK(strcmp(devmem_last_error(), "") == 0); /* nothing has failed yet */
}

static void test_alloc_free(void) {
  void* p = NULL;
  void* zero = (void*)&p;
  char text[64];

  CHECK(devmem_alloc(&p, MiB, 0, NULL) == DEVMEM_OK);
  CHECK(p != NULL);
  CHECK(((uintptr_t)p % 512) == 0);
  memset(p, 0xab, MiB); /* sim memory is host accessible */
  CHECK(((unsigned char*)p)[MiB - 1] == 0xab);
  CHECK(devmem_record_stream(p, NULL) == DEVMEM_OK);

  CHECK(devmem_alloc(&zero, 0, 0, NULL) == DEVMEM_OK);
  CHECK(zero == NULL);

  CHECK(devmem_free(p) == DEVMEM_OK);
  CHECK(devmem_free(NULL) == DEVMEM_OK);
  /* A double free is refused, and the message names the pointer. */
  CHECK(devmem_free(p) == DEVMEM_ERR_INVALID);
  snprintf(text, sizeof text, "%p", p);
  CHECK(contains(devmem_last_error(), text));
  CHECK(contains(devmem_last_error(), "already freed"));
  /* So is an interior pointer of a live allocation. */
  CHECK(devmem_alloc(&p, 4096, 0, NULL) == DEVMEM_OK);
  CHECK(devmem_free((char*)p + 512) == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "interior pointer"));
  CHECK(devmem_record_stream((char*)p + 512, NULL) == DEVMEM_ERR_INVALID);
  CHECK(devmem_free(p) == DEVMEM_OK);
}

static void test_bad_arguments(void) {
  void* p = &p;
  char* json;
  CHECK(devmem_alloc(NULL, 1024, 0, NULL) == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "out"));
  CHECK(devmem_alloc(&p, 1024, -1, NULL) == DEVMEM_ERR_INVALID);
  CHECK(p == NULL);
  CHECK(contains(devmem_last_error(), "device -1"));
  /* The sim knows only its own streams: a foreign stream pointer is refused. */
  CHECK(devmem_alloc(&p, 1024, 0, (void*)0x1234) == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "stream 0x1234 on sim:0"));
  CHECK(devmem_alloc(&p, SIZE_MAX, 0, NULL) == DEVMEM_ERR_INVALID);
  CHECK(devmem_alloc(&p, 4096, 0, NULL) == DEVMEM_OK);
  CHECK(devmem_record_stream(p, (void*)0x1234) == DEVMEM_ERR_INVALID);
  CHECK(devmem_free(p) == DEVMEM_OK);
  /* devmem_release_stream: the default stream, a bad device, a device without streams. */
  CHECK(devmem_release_stream(0, NULL) == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "devmem_release_stream(0, NULL)"));
  CHECK(devmem_release_stream(-1, (void*)0x1234) == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "device -1"));
  CHECK(devmem_release_stream(0, (void*)0x1234) == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "sim:0 has no streams"));
  CHECK(devmem_push_tag(NULL) == DEVMEM_ERR_INVALID);
  CHECK(devmem_pop_tag() == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "no tag pushed"));
  CHECK(devmem_torch_alloc(-1, 0, NULL) == NULL);
  CHECK(contains(devmem_last_error(), "negative size"));
  CHECK(devmem_stats_json(-2) == NULL);
  CHECK(devmem_empty_cache(-1) == DEVMEM_OK);
  CHECK(devmem_empty_cache(-2) == DEVMEM_ERR_INVALID);
  /* A device devmem has not used: nothing to empty, and no allocator is made for it. */
  CHECK(devmem_empty_cache(7) == DEVMEM_OK);
  json = devmem_snapshot_json();
  CHECK(json != NULL && !contains(json, "sim:7"));
  devmem_string_free(json);
}

static void test_oom_names_tags(void) {
  void* weights = NULL;
  void* activations = &weights;
  char* json;

  CHECK(devmem_push_tag("weights") == DEVMEM_OK);
  CHECK(devmem_alloc(&weights, 40 * MiB, 0, NULL) == DEVMEM_OK);
  CHECK(devmem_push_tag("activations") == DEVMEM_OK);
  CHECK(devmem_alloc(&activations, 40 * MiB, 0, NULL) == DEVMEM_ERR_OOM);
  CHECK(activations == NULL);
  /* The report names who asked (the innermost tag) and who holds the memory. */
  CHECK(contains(devmem_last_error(), "out of memory on sim:0"));
  CHECK(contains(devmem_last_error(), "requested by: activations @ capi (alloc)"));
  CHECK(contains(devmem_last_error(), "1. weights @ capi (alloc): 40.0 MiB"));
  CHECK(devmem_pop_tag() == DEVMEM_OK);
  CHECK(devmem_pop_tag() == DEVMEM_OK);
  CHECK(devmem_pop_tag() == DEVMEM_ERR_INVALID);

  json = devmem_stats_json(0);
  CHECK(json != NULL);
  CHECK(contains(json, "\"schema\":\"devmem.stats/1\""));
  CHECK(contains(json, "\"device\":\"sim:0\""));
  CHECK(contains(json, "\"num_ooms\":1"));
  CHECK(contains(json, "\"where\":\"weights @ capi (alloc)\""));
  devmem_string_free(json);

  json = devmem_snapshot_json();
  CHECK(json != NULL);
  CHECK(contains(json, "\"schema\":\"devmem.snapshot/1\""));
  CHECK(contains(json, "\"tag\":\"weights\""));
  devmem_string_free(json);
  devmem_string_free(NULL);

  CHECK(devmem_free(weights) == DEVMEM_OK);
  CHECK(devmem_empty_cache(0) == DEVMEM_OK);
  json = devmem_stats_json(0);
  CHECK(contains(json, "\"reserved_bytes\":{\"all\":{\"current\":0,"));
  devmem_string_free(json);
}

static void test_framework_entry_points(void) {
  void* t;
  void* c;
  CHECK(devmem_push_tag("frameworks") == DEVMEM_OK);
  t = devmem_torch_alloc(4096, 0, NULL);
  c = devmem_cupy_malloc(NULL, 8192, 0);
  CHECK(t != NULL && c != NULL && t != c);
  CHECK(devmem_torch_alloc(0, 0, NULL) == NULL); /* size 0: NULL, not an error */
  CHECK(devmem_record_stream(t, NULL) == DEVMEM_OK);
  devmem_torch_free(t, 4096, 0, NULL);
  devmem_cupy_free(NULL, c, 0);
  devmem_torch_free(NULL, 0, 0, NULL);
  devmem_cupy_free(NULL, NULL, 0);
  CHECK(devmem_free(t) == DEVMEM_ERR_INVALID); /* already freed by devmem_torch_free */
  CHECK(devmem_pop_tag() == DEVMEM_OK);
}

/* Another thread has its own last error and tag stack. */
static void* worker(void* arg) {
  int* ok = (int*)arg;
  void* p = NULL;
  *ok = strcmp(devmem_last_error(), "") == 0 && devmem_pop_tag() == DEVMEM_ERR_INVALID &&
        devmem_push_tag("worker") == DEVMEM_OK && devmem_alloc(&p, 4096, 0, NULL) == DEVMEM_OK &&
        devmem_free(p) == DEVMEM_OK && devmem_pop_tag() == DEVMEM_OK &&
        devmem_pop_tag() == DEVMEM_ERR_INVALID;
  return NULL;
}

static void test_threads(void) {
  pthread_t thread;
  int ok = 0;
  CHECK(devmem_push_tag("main") == DEVMEM_OK);
  CHECK(devmem_free((void*)0x10) == DEVMEM_ERR_INVALID);
  CHECK(pthread_create(&thread, NULL, worker, &ok) == 0);
  CHECK(pthread_join(thread, NULL) == 0);
  CHECK(ok);
  CHECK(contains(devmem_last_error(), "0x10")); /* this thread's error is untouched */
  CHECK(devmem_pop_tag() == DEVMEM_OK);
}

/* With a second device in use, devmem_free and devmem_record_stream find the owner. */
static void test_two_devices(void) {
  void* a = NULL;
  void* b = NULL;
  char text[64];
  char* json;
  CHECK(devmem_alloc(&a, 4096, 0, NULL) == DEVMEM_OK);
  CHECK(devmem_alloc(&b, 4096, 1, NULL) == DEVMEM_OK);
  CHECK(a != NULL && b != NULL && a != b);
  json = devmem_stats_json(1);
  CHECK(contains(json, "\"device\":\"sim:1\""));
  CHECK(contains(json, "\"current\":1,"));
  devmem_string_free(json);
  CHECK(devmem_record_stream(b, NULL) == DEVMEM_OK);
  CHECK(devmem_free(b) == DEVMEM_OK);
  CHECK(devmem_free(a) == DEVMEM_OK);
  CHECK(devmem_free(b) == DEVMEM_ERR_INVALID);
  snprintf(text, sizeof text, "%p", b);
  CHECK(contains(devmem_last_error(), text));
  CHECK(contains(devmem_last_error(), "(sim:0, sim:1)"));
  CHECK(devmem_record_stream(a, NULL) == DEVMEM_ERR_INVALID);
  /* Peer access: the sim has no peers; each error names both devices. */
  CHECK(devmem_enable_peer_access(1, 0) == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "devmem_enable_peer_access(device 1, peer 0)"));
  CHECK(contains(devmem_last_error(), "sim:0: this backend has no peer devices"));
  CHECK(devmem_enable_peer_access(1, 1) == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "a device has access to its own memory"));
  CHECK(devmem_enable_peer_access(-2, 0) == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "device -2 does not exist"));
}

/* IPC: the sim's memory cannot be mapped by another process; each error says so and
 * leaves the outputs zeroed. */
static void test_ipc(void) {
  void* p = NULL;
  void* mapped = &p;
  devmem_ipc_handle h;
  memset(&h, 0x7f, sizeof h);
  CHECK(devmem_alloc(&p, 4096, 0, NULL) == DEVMEM_OK);
  CHECK(devmem_ipc_export(p, &h) == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "sim:0: this backend (sim) has no IPC"));
  CHECK(h.fds == NULL && h.num_fds == 0 && h.size == 0);
  CHECK(devmem_ipc_export(p, NULL) == DEVMEM_ERR_INVALID);
  CHECK(devmem_ipc_import(0, &h, &mapped) == DEVMEM_ERR_INVALID);
  CHECK(mapped == NULL);
  CHECK(contains(devmem_last_error(), "has no IPC"));
  CHECK(devmem_ipc_import(0, NULL, &mapped) == DEVMEM_ERR_INVALID);
  CHECK(devmem_ipc_close(0, p) == DEVMEM_ERR_INVALID);
  devmem_ipc_handle_close(&h);
  devmem_ipc_handle_close(NULL);
  CHECK(devmem_free(p) == DEVMEM_OK);
}

/* Hostile input: device indices past sim_devices (64 by default) are invalid and make
 * no device; a thread's tag stack is bounded; a tag of invalid UTF-8 leaves the JSON
 * views working, with the bad bytes replaced by U+FFFD. */
static void test_hostile_input(void) {
  void* p = &p;
  char* json;
  int i;
  int ok = 1;
  CHECK(devmem_alloc(&p, 4096, 64, NULL) == DEVMEM_ERR_INVALID);
  CHECK(p == NULL);
  CHECK(contains(devmem_last_error(), "sim:64 does not exist"));
  CHECK(contains(devmem_last_error(), "sim_devices is 64"));
  CHECK(devmem_alloc(&p, 4096, 2147483647, NULL) == DEVMEM_ERR_INVALID);
  CHECK(devmem_torch_alloc(4096, 1000, NULL) == NULL);
  CHECK(devmem_stats_json(100000) == NULL);
  CHECK(contains(devmem_last_error(), "sim:100000 does not exist"));
  json = devmem_snapshot_json();
  CHECK(json != NULL && !contains(json, "sim:64") && !contains(json, "sim:1000"));
  devmem_string_free(json);

  for (i = 0; i < 1024; ++i) ok = ok && devmem_push_tag("deep") == DEVMEM_OK;
  CHECK(ok);
  CHECK(devmem_push_tag("one too many") == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "tag stack is full (1024 tags"));
  for (i = 0; i < 1024; ++i) ok = ok && devmem_pop_tag() == DEVMEM_OK;
  CHECK(ok);
  CHECK(devmem_pop_tag() == DEVMEM_ERR_INVALID);

  CHECK(devmem_push_tag("bad\xff\xc3tag") == DEVMEM_OK);
  CHECK(devmem_alloc(&p, 4096, 0, NULL) == DEVMEM_OK);
  json = devmem_stats_json(0);
  CHECK(json != NULL);
  CHECK(contains(json, "bad\xef\xbf\xbd\xef\xbf\xbdtag"));
  devmem_string_free(json);
  json = devmem_snapshot_json();
  CHECK(contains(json, "bad\xef\xbf\xbd\xef\xbf\xbdtag"));
  devmem_string_free(json);
  CHECK(devmem_free(p) == DEVMEM_OK);
  CHECK(devmem_pop_tag() == DEVMEM_OK);
}

static void test_bad_conf(void) {
  void* p = &p;
  CHECK(devmem_alloc(&p, 1024, 0, NULL) == DEVMEM_ERR_CONFIG);
  CHECK(p == NULL);
  CHECK(contains(devmem_last_error(), "bogus_key"));
  CHECK(devmem_snapshot_json() == NULL);
  CHECK(contains(devmem_last_error(), "runtime could not start"));
  CHECK(devmem_torch_alloc(1024, 0, NULL) == NULL);
}

static void test_arena_scopes(void) {
  void* a = NULL;
  void* b = NULL;
  void* big = NULL;
  CHECK(devmem_arena_pop() == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "no arena scope pushed"));
  CHECK(devmem_arena_push(0, NULL) == DEVMEM_ERR_INVALID);
  CHECK(devmem_arena_push(0, "") == DEVMEM_ERR_INVALID);
  CHECK(devmem_arena_push(-1, "step") == DEVMEM_ERR_INVALID);
  CHECK(devmem_arena_push(0, "step") == DEVMEM_OK);
  CHECK(devmem_alloc(&a, 1000, 0, NULL) == DEVMEM_OK);
  CHECK(devmem_alloc(&b, 1000, 0, NULL) == DEVMEM_OK);
  CHECK((char*)b - (char*)a == 1024); /* two bumps in one chunk */
  CHECK(devmem_alloc(&big, 2 * MiB, 0, NULL) == DEVMEM_OK); /* too large: the pool */
  CHECK(devmem_free(a) == DEVMEM_OK);
  CHECK(devmem_free(a) == DEVMEM_ERR_INVALID); /* freed twice: named, nothing changes */
  CHECK(contains(devmem_last_error(), "arena 'step'"));
  CHECK(devmem_arena_pop() == DEVMEM_OK);
  CHECK(devmem_arena_pop() == DEVMEM_ERR_INVALID);
  CHECK(devmem_free(b) == DEVMEM_OK); /* escaped the scope, still valid */
  CHECK(devmem_free(big) == DEVMEM_OK);
  CHECK(devmem_empty_cache(0) == DEVMEM_OK);
}

/* A filter that takes every stream, counting its calls. */
static int take_all(void* ctx, void* stream) {
  (void)stream;
  ++*(int*)ctx;
  return 1;
}

/* Private pools (CUDA graphs) with PyTorch's shape: a pool's freed blocks are not handed
 * to allocations outside it; misuse is DEVMEM_ERR_INVALID naming the pool. */
static void test_private_pools(void) {
  void* p = NULL;
  void* q = NULL;
  int calls = 0;
  CHECK(devmem_begin_allocate_to_pool(0, 5, 6, take_all, &calls) == DEVMEM_OK);
  CHECK(devmem_alloc(&p, MiB, 0, NULL) == DEVMEM_OK);
  CHECK(calls > 0);
  CHECK(devmem_free(p) == DEVMEM_OK); /* back to the pool, not to the shared cache */
  CHECK(devmem_end_allocate_to_pool(0, 5, 6) == DEVMEM_OK);
  CHECK(devmem_alloc(&q, MiB, 0, NULL) == DEVMEM_OK);
  CHECK(q != p);
  CHECK(devmem_free(q) == DEVMEM_OK);
  CHECK(devmem_end_allocate_to_pool(0, 5, 6) == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "end_allocate_to_pool((5, 6))"));
  CHECK(devmem_begin_allocate_to_pool(0, 5, 6, NULL, NULL) == DEVMEM_OK); /* shares it */
  CHECK(devmem_release_pool(0, 5, 6) == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "release_pool((5, 6))"));
  CHECK(contains(devmem_last_error(), "in use"));
  CHECK(devmem_end_allocate_to_pool(0, 5, 6) == DEVMEM_OK);
  CHECK(devmem_release_pool(0, 5, 6) == DEVMEM_OK);
  CHECK(devmem_release_pool(0, 5, 6) == DEVMEM_OK); /* the second begin's release */
  CHECK(devmem_release_pool(0, 5, 6) == DEVMEM_ERR_INVALID);
  CHECK(devmem_begin_allocate_to_pool(0, 0, 0, NULL, NULL) == DEVMEM_ERR_INVALID);
  CHECK(contains(devmem_last_error(), "default pool"));
  CHECK(devmem_empty_cache(0) == DEVMEM_OK);
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "--bad-conf") == 0) {
    test_bad_conf();
  } else {
    test_names();
    test_alloc_free();
    test_bad_arguments();
    test_oom_names_tags();
    test_framework_entry_points();
    test_threads();
    test_arena_scopes();
    test_private_pools();
    test_hostile_input();
    test_ipc();
    test_two_devices(); /* last: from here on devmem has used two devices */
  }
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
