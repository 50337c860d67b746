/*
 * fitevict buftrace: log every ggml backend buffer an engine process allocates or frees, to the byte.
 *
 * Loaded with LD_PRELOAD into llama-server. The pinned build links ggml statically, so its internal calls to
 * ggml_backend_buffer_init / ggml_backend_buffer_free cannot be interposed by symbol. Instead, at load time this
 * library finds both functions (dlsym, else the executable's own symbol table), writes a breakpoint (int3) on
 * their first byte, and handles SIGTRAP: it logs the call's arguments, puts the original byte back, single-steps
 * one instruction (the trap flag), and re-arms the breakpoint. Lines go to stderr (fd 2):
 *
 *   fitevict-buftrace: alloc <buffer type name> <bytes>
 *   fitevict-buftrace: free <buffer type name> <bytes>
 *   fitevict-buftrace: ready            (both breakpoints armed)
 *   fitevict-buftrace: unavailable: <why>
 *
 * ggml_backend_buffer_init(buft, iface (by value, in memory), context, size): buft in rdi, size in rdx
 * (System V x86-64: a struct passed in memory takes no register). ggml_backend_buffer_free(buffer): buffer in rdi;
 * its buft and size sit after the 11-pointer iface (ggml-backend-impl.h at the pinned commit). A buffer type's
 * first member is get_name. x86-64 Linux only.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <ucontext.h>
#include <unistd.h>

#if !defined(__x86_64__) || !defined(__linux__)
__attribute__((constructor)) static void fitevict_buftrace_init(void) {
    static const char msg[] = "fitevict-buftrace: unavailable: only x86-64 Linux is supported\n";
    (void) !write(2, msg, sizeof msg - 1);
}
#else

#define IFACE_POINTERS 11 /* struct ggml_backend_buffer_i at the pinned commit */
#define BUFT_OFFSET (IFACE_POINTERS * sizeof(void *))
#define SIZE_OFFSET (BUFT_OFFSET + 2 * sizeof(void *))
#define MAX_BUFTS 64

typedef const char * (*get_name_fn)(void *);

struct bp {
    uintptr_t addr;
    uint8_t orig;
    int is_free;
};

static struct bp bps[2];
static int n_bps;
static __thread struct bp * stepping;
static void * bufts[MAX_BUFTS];
static int n_bufts;

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

static void log_buffer(const char * what, void * buft, uint64_t size) {
    char line[256];
    char num[24];
    const char * name = "?";
    if (buft) {
        get_name_fn get_name = *(get_name_fn *) buft;
        if (get_name) {
            name = get_name(buft);
        }
    }
    fmt_u64(num, size);
    line[0] = 0;
    strcat(line, "fitevict-buftrace: ");
    strcat(line, what);
    strcat(line, " ");
    strncat(line, name, 160);
    strcat(line, " ");
    strcat(line, num);
    strcat(line, "\n");
    say(line);
}

static int known_buft(void * buft) {
    for (int i = 0; i < n_bufts; i++) {
        if (bufts[i] == buft) {
            return 1;
        }
    }
    return 0;
}

static void on_trap(int sig, siginfo_t * info, void * vctx) {
    (void) sig;
    (void) info;
    ucontext_t * uc = (ucontext_t *) vctx;
    greg_t * r = uc->uc_mcontext.gregs;
    if (stepping) { /* one instruction after a breakpoint ran: re-arm it */
        *(volatile uint8_t *) stepping->addr = 0xCC;
        stepping = NULL;
        r[REG_EFL] &= ~(greg_t) 0x100;
        return;
    }
    uintptr_t at = (uintptr_t) r[REG_RIP] - 1;
    for (int i = 0; i < n_bps; i++) {
        struct bp * b = &bps[i];
        if (b->addr != at) {
            continue;
        }
        if (b->is_free) {
            char * buf = (char *) r[REG_RDI];
            if (buf) {
                void * buft = *(void **) (buf + BUFT_OFFSET);
                uint64_t size = *(uint64_t *) (buf + SIZE_OFFSET);
                if (known_buft(buft)) {
                    log_buffer("free", buft, size);
                } else {
                    say("fitevict-buftrace: free-unknown\n");
                }
            }
        } else {
            void * buft = (void *) r[REG_RDI];
            if (buft && !known_buft(buft) && n_bufts < MAX_BUFTS) {
                bufts[n_bufts++] = buft;
            }
            log_buffer("alloc", buft, (uint64_t) r[REG_RDX]);
        }
        *(volatile uint8_t *) b->addr = b->orig;
        r[REG_RIP] = (greg_t) b->addr;
        r[REG_EFL] |= 0x100;
        stepping = b;
        return;
    }
    /* not ours: fall back to the default action */
    signal(SIGTRAP, SIG_DFL);
    raise(SIGTRAP);
}

static int first_object(struct dl_phdr_info * info, size_t size, void * data) {
    (void) size;
    *(uintptr_t *) data = (uintptr_t) info->dlpi_addr;
    return 1; /* the first entry is the executable */
}

/* the address of `name` in the executable's .symtab (static symbols included), or 0 */
static uintptr_t exe_symbol(const char * name) {
    int fd = open("/proc/self/exe", O_RDONLY);
    if (fd < 0) {
        return 0;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return 0;
    }
    uint8_t * m = mmap(NULL, (size_t) st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        return 0;
    }
    uintptr_t found = 0;
    Elf64_Ehdr * eh = (Elf64_Ehdr *) m;
    Elf64_Shdr * sh = (Elf64_Shdr *) (m + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum && !found; i++) {
        if (sh[i].sh_type != SHT_SYMTAB) {
            continue;
        }
        Elf64_Sym * syms = (Elf64_Sym *) (m + sh[i].sh_offset);
        const char * strtab = (const char *) (m + sh[sh[i].sh_link].sh_offset);
        size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
        for (size_t j = 0; j < n; j++) {
            if (ELF64_ST_TYPE(syms[j].st_info) == STT_FUNC && syms[j].st_value &&
                strcmp(strtab + syms[j].st_name, name) == 0) {
                uintptr_t base = 0;
                dl_iterate_phdr(first_object, &base);
                found = base + (uintptr_t) syms[j].st_value;
                break;
            }
        }
    }
    munmap(m, (size_t) st.st_size);
    return found;
}

static uintptr_t find(const char * name) {
    void * p = dlsym(RTLD_DEFAULT, name);
    return p ? (uintptr_t) p : exe_symbol(name);
}

static int arm(uintptr_t addr, int is_free) {
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t start = addr & ~(uintptr_t) (page - 1);
    if (mprotect((void *) start, (size_t) page * 2, PROT_READ | PROT_WRITE | PROT_EXEC) != 0) {
        return 0;
    }
    struct bp * b = &bps[n_bps++];
    b->addr = addr;
    b->orig = *(uint8_t *) addr;
    b->is_free = is_free;
    *(volatile uint8_t *) addr = 0xCC;
    return 1;
}

__attribute__((constructor)) static void fitevict_buftrace_init(void) {
    uintptr_t init = find("ggml_backend_buffer_init");
    uintptr_t fre = find("ggml_backend_buffer_free");
    if (!init || !fre) {
        say("fitevict-buftrace: unavailable: ggml_backend_buffer_init/free not found in the process "
            "(a stripped binary?)\n");
        return;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTRAP, &sa, NULL) != 0) {
        say("fitevict-buftrace: unavailable: cannot install the SIGTRAP handler\n");
        return;
    }
    if (!arm(init, 0) || !arm(fre, 1)) {
        say("fitevict-buftrace: unavailable: cannot make the code page writable (mprotect refused)\n");
        return;
    }
    say("fitevict-buftrace: ready\n");
}
#endif
