/*
 * fitevict buftrace: log every ggml backend buffer an engine process allocates or frees, to the byte.
 *
 * Loaded with LD_PRELOAD into llama-server. The pinned build links ggml statically and the compiler inlines
 * ggml_backend_buffer_init into most of its callers, so neither symbol interposition nor a breakpoint on that
 * function sees every buffer. What every buffer does go through is C++'s operator new / delete of its
 * `struct ggml_backend_buffer` (120 bytes at the pinned commit), called through the PLT of the dynamic
 * libstdc++: those this library interposes.
 *
 *  - operator new(120): the block is zeroed and remembered, per thread, as a candidate.
 *  - at the thread's next operator new / delete (the buffer's fields are filled in between), each candidate is
 *    checked: buft (offset 88) must point to readable memory whose first word (get_name) is code, iface's
 *    free_buffer (offset 0) code or NULL, usage (offset 112) 0..2. A buffer is then logged with its type's
 *    name and its size (offset 104); anything else is forgotten.
 *  - operator delete of a logged buffer logs its release.
 *
 * Lines go to stderr (fd 2):
 *   fitevict-buftrace: ready
 *   fitevict-buftrace: alloc <buffer type name> <bytes>
 *   fitevict-buftrace: free <buffer type name> <bytes>
 *   fitevict-buftrace: unavailable: <why>
 * Linux only; struct layout from ggml-backend-impl.h at the pinned commit (11 iface pointers).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define BUFFER_BYTES 120
#define OFF_BUFT 88
#define OFF_SIZE 104
#define OFF_USAGE 112
#define MAX_PENDING 64
#define MAX_LIVE 8192
#define MAX_CODE 64

static void * (*real_new)(size_t);
static void (*real_delete)(void *);
static void (*real_delete_sized)(void *, size_t);
static int ready;

static __thread void * pending[MAX_PENDING];
static __thread int n_pending;
static __thread int busy;

static void * live[MAX_LIVE];
static volatile int live_lock;

static uintptr_t code_lo[MAX_CODE], code_hi[MAX_CODE];
static int n_code;

static void say(const char * s) {
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w <= 0) {
            return;
        }
        s += w;
        n -= (size_t) w;
    }
}

static int readable(const void * p, size_t n, void * out) {
    struct iovec local = {out, n};
    struct iovec remote = {(void *) p, n};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t) n;
}

static int is_code(uintptr_t a) {
    for (int i = 0; i < n_code; i++) {
        if (a >= code_lo[i] && a < code_hi[i]) {
            return 1;
        }
    }
    return 0;
}

static int collect_code(struct dl_phdr_info * info, size_t size, void * data) {
    (void) size;
    (void) data;
    for (int i = 0; i < info->dlpi_phnum && n_code < MAX_CODE; i++) {
        const ElfW(Phdr) * ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            code_lo[n_code] = info->dlpi_addr + ph->p_vaddr;
            code_hi[n_code] = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
            n_code++;
        }
    }
    return 0;
}

static void fmt_u64(char * out, uint64_t v) {
    char tmp[24];
    int i = 0;
    do {
        tmp[i++] = (char) ('0' + v % 10);
        v /= 10;
    } while (v);
    while (i) {
        *out++ = tmp[--i];
    }
    *out = 0;
}

/* name and size of a ggml_backend_buffer at p, or 0 when p does not hold one */
static int read_buffer(void * p, char * name, size_t name_cap, uint64_t * size) {
    unsigned char b[BUFFER_BYTES];
    if (!readable(p, sizeof b, b)) {
        return 0;
    }
    uintptr_t free_buffer, buft, get_name;
    uint32_t usage;
    memcpy(&free_buffer, b, sizeof free_buffer);
    memcpy(&buft, b + OFF_BUFT, sizeof buft);
    memcpy(size, b + OFF_SIZE, sizeof *size);
    memcpy(&usage, b + OFF_USAGE, sizeof usage);
    if (!buft || usage > 2 || (free_buffer && !is_code(free_buffer))) {
        return 0;
    }
    if (!readable((void *) buft, sizeof get_name, &get_name) || !is_code(get_name)) {
        return 0;
    }
    const char * s = ((const char * (*)(void *)) get_name)((void *) buft);
    if (!s) {
        return 0;
    }
    size_t i = 0;
    for (; i + 1 < name_cap; i++) {
        char c;
        if (!readable(s + i, 1, &c)) {
            return 0;
        }
        if (c == 0) {
            break;
        }
        if (c <= ' ' || c > '~') {
            return 0;
        }
        name[i] = c;
    }
    name[i] = 0;
    return i > 0;
}

static void log_line(const char * what, const char * name, uint64_t size) {
    char line[160];
    char num[24];
    fmt_u64(num, size);
    line[0] = 0;
    strcat(line, "fitevict-buftrace: ");
    strcat(line, what);
    strcat(line, " ");
    strncat(line, name, 80);
    strcat(line, " ");
    strcat(line, num);
    strcat(line, "\n");
    say(line);
}

static void lock(void) {
    while (__atomic_exchange_n(&live_lock, 1, __ATOMIC_ACQUIRE)) {
    }
}

static void unlock(void) {
    __atomic_store_n(&live_lock, 0, __ATOMIC_RELEASE);
}

static void flush(void) {
    for (int i = 0; i < n_pending; i++) {
        char name[72];
        uint64_t size;
        if (!read_buffer(pending[i], name, sizeof name, &size)) {
            continue;
        }
        lock();
        for (int j = 0; j < MAX_LIVE; j++) {
            if (!live[j]) {
                live[j] = pending[i];
                break;
            }
        }
        unlock();
        log_line("alloc", name, size);
    }
    n_pending = 0;
}

static void released(void * p) {
    if (!p) {
        return;
    }
    int found = 0;
    lock();
    for (int j = 0; j < MAX_LIVE; j++) {
        if (live[j] == p) {
            live[j] = 0;
            found = 1;
            break;
        }
    }
    unlock();
    char name[72];
    uint64_t size;
    if (found && read_buffer(p, name, sizeof name, &size)) {
        log_line("free", name, size);
    }
}

static int init(void) {
    if (ready) {
        return 1;
    }
    real_new = (void * (*)(size_t)) dlsym(RTLD_NEXT, "_Znwm");
    real_delete = (void (*)(void *)) dlsym(RTLD_NEXT, "_ZdlPv");
    real_delete_sized = (void (*)(void *, size_t)) dlsym(RTLD_NEXT, "_ZdlPvm");
    if (!real_new || !real_delete) {
        return 0;
    }
    n_code = 0;
    dl_iterate_phdr(collect_code, NULL);
    ready = 1;
    return 1;
}

void * _Znwm(size_t n) {
    if (!ready && !init()) {
        say("fitevict-buftrace: unavailable: operator new not found in the process (no dynamic libstdc++)\n");
        _exit(70);
    }
    if (!busy) {
        busy = 1;
        if (n_pending) {
            flush();
        }
        busy = 0;
    }
    void * p = real_new(n);
    if (n == BUFFER_BYTES && !busy) {
        memset(p, 0, n);
        if (n_pending < MAX_PENDING) {
            pending[n_pending++] = p;
        }
    }
    return p;
}

static void before_delete(void * p) {
    if (busy) {
        return;
    }
    busy = 1;
    if (n_pending) {
        flush();  /* a buffer freed before this thread allocated again is logged first */
    }
    released(p);
    busy = 0;
}

void _ZdlPv(void * p) {
    if (!ready && !init()) {
        return;
    }
    before_delete(p);
    real_delete(p);
}

void _ZdlPvm(void * p, size_t n) {
    if (!ready && !init()) {
        return;
    }
    before_delete(p);
    if (real_delete_sized) {
        real_delete_sized(p, n);
    } else {
        real_delete(p);
    }
}

__attribute__((constructor)) static void fitevict_buftrace_init(void) {
    if (init()) {
        say("fitevict-buftrace: ready\n");
    } else {
        say("fitevict-buftrace: unavailable: operator new / delete not found (no dynamic libstdc++)\n");
    }
}

__attribute__((destructor)) static void fitevict_buftrace_fini(void) {
    if (ready && !busy) {
        flush();
    }
}
