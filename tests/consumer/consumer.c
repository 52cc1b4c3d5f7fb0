/* tests/consumer/consumer.c: libdevmem.so through its installed header, as a C99
 * program uses it. The library's version must be the headers'. Exit status 0 when the
 * allocation, the version and the free work; otherwise the reason on stderr. */
#include <stdio.h>
#include <string.h>

#include <devmem/devmem.h>
#include <devmem/devmem_version.h>

int main(void) {
  void* p = NULL;
  if (strcmp(devmem_version(), DEVMEM_VERSION) != 0) {
    fprintf(stderr, "consumer_c: libdevmem.so is %s, the headers %s\n", devmem_version(),
            DEVMEM_VERSION);
    return 1;
  }
  if (devmem_alloc(&p, 1 << 20, 0, NULL) != DEVMEM_OK || p == NULL) {
    fprintf(stderr, "consumer_c: devmem_alloc: %s\n", devmem_last_error());
    return 1;
  }
  if (devmem_free(p) != DEVMEM_OK) {
    fprintf(stderr, "consumer_c: devmem_free: %s\n", devmem_last_error());
    return 1;
  }
  printf("consumer_c: libdevmem %s ok\n", devmem_version());
  return 0;
}
