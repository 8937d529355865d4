/*
 * membw: sustained memory read bandwidth, the ceiling of bandwidth-bound decode.
 *
 *   gcc -O2 -march=native -pthread -o membw dev/membw.c
 *   ./membw [-s MiB] [-r reps] [-f FILE] [-v]
 *
 * Streams a buffer far larger than the last-level cache with 1 and then 2 (up to
 * the online CPU count) threads, each summing its contiguous slice with 64-byte
 * vector loads into four independent accumulators (no stores, so only reads are
 * counted). Threads start together at a barrier; one run is the time from the
 * barrier to the last thread's finish. Prints best and mean GB/s (1e9 bytes/s)
 * over the repetitions; "best" is the usual figure for a peak, the mean shows noise.
 *
 * The buffer is anonymous memory (default 1024 MiB, memset first so every page is
 * resident), or with -f a read-only mmap of FILE populated from the page cache --
 * the same kind of mapping mlxcel reads its weights from (4 KiB pages, no THP),
 * so the two figures bound what decode can reach. -v prints every repetition
 * (to see drift over a long run).
 *
 * Not linked into anything (dev/ is the lab); compiled by hand as above.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_THREADS 64

/* 64 bytes: one cache line, one AVX-512 register (two AVX2 ones) */
typedef long long vec64 __attribute__((vector_size(64), aligned(64)));

struct job {
    const vec64 *p;        /* slice start */
    size_t n;              /* vectors in the slice (multiple of 4) */
    pthread_barrier_t *go;
    vec64 sum;             /* result, read so the loads are not elided */
    double t_end;
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *reader(void *arg)
{
    struct job *j = arg;
    vec64 a = {0}, b = {0}, c = {0}, d = {0};
    pthread_barrier_wait(j->go);
    for (size_t i = 0; i < j->n; i += 4) {
        a += j->p[i];
        b += j->p[i + 1];
        c += j->p[i + 2];
        d += j->p[i + 3];
    }
    j->sum = a + b + c + d;
    j->t_end = now();
    return NULL;
}

/* One timed pass over bytes of buf with nth threads; returns seconds. */
static double run_once(const void *buf, size_t bytes, int nth)
{
    pthread_t th[MAX_THREADS];
    struct job jobs[MAX_THREADS];
    pthread_barrier_t go;
    size_t n = bytes / sizeof(vec64) / 4 * 4, per = n / nth / 4 * 4;
    pthread_barrier_init(&go, NULL, nth + 1);
    for (int t = 0; t < nth; t++) {
        jobs[t] = (struct job){.p = (const vec64 *)buf + t * per,
                               .n = t == nth - 1 ? n - t * per : per, .go = &go};
        pthread_create(&th[t], NULL, reader, &jobs[t]);
    }
    pthread_barrier_wait(&go);
    double t0 = now(), t1 = t0;
    long long sink = 0;
    for (int t = 0; t < nth; t++) {
        pthread_join(th[t], NULL);
        t1 = jobs[t].t_end > t1 ? jobs[t].t_end : t1;
        for (int k = 0; k < 8; k++)
            sink ^= jobs[t].sum[k];
    }
    pthread_barrier_destroy(&go);
    if (sink == 0x5a5a5a5a)   /* practically never; keeps the sums live */
        fputc(' ', stderr);
    return t1 - t0;
}

static const void *map_file(const char *path, size_t *bytes)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        perror(path);
        exit(1);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    *bytes = (size_t)st.st_size;
    return p;
}

int main(int argc, char **argv)
{
    size_t mib = 1024, bytes;
    int reps = 10, c, verbose = 0;
    const char *file = NULL;
    while ((c = getopt(argc, argv, "s:r:f:v")) != -1) {
        switch (c) {
        case 's': mib = strtoul(optarg, NULL, 10); break;
        case 'r': reps = atoi(optarg); break;
        case 'f': file = optarg; break;
        case 'v': verbose = 1; break;
        default:
            fprintf(stderr, "usage: %s [-s MiB] [-r reps] [-f FILE] [-v]\n", argv[0]);
            return 2;
        }
    }
    if (mib == 0 || reps < 1) {
        fprintf(stderr, "-s and -r must be positive\n");
        return 2;
    }
    const void *buf;
    if (file) {
        buf = map_file(file, &bytes);
    } else {
        bytes = mib << 20;
        void *p = aligned_alloc(64, bytes);
        if (!p) {
            fprintf(stderr, "cannot allocate %zu MiB\n", mib);
            return 1;
        }
        memset(p, 1, bytes);
        buf = p;
    }
    /* the vector loads want 64-byte alignment; a mapping is page aligned */
    int max_th = (int)sysconf(_SC_NPROCESSORS_ONLN);
    max_th = max_th > MAX_THREADS ? MAX_THREADS : max_th;
    printf("buffer %.1f MiB (%s), %d reps\n", bytes / 1048576.0, file ? file : "anonymous", reps);
    for (int nth = 1; nth <= max_th; nth *= 2) {
        double best = 0, sum = 0;
        run_once(buf, bytes, nth);   /* warm-up */
        for (int r = 0; r < reps; r++) {
            double gbs = bytes / run_once(buf, bytes, nth) / 1e9;
            best = gbs > best ? gbs : best;
            sum += gbs;
            if (verbose)
                printf("  threads %d rep %d: %.2f GB/s\n", nth, r + 1, gbs);
        }
        printf("threads %2d: best %6.2f GB/s, mean %6.2f GB/s\n", nth, best, sum / reps);
        if (nth < max_th && nth * 2 > max_th)
            nth = max_th / 2;   /* end with all CPUs */
    }
    return 0;
}
