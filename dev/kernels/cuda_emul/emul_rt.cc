/* cuda_emul: the runtime behind cuda_impl.h (blocks in order, threads on pthreads). */
#include "cuda_impl.h"

thread_local uint3e threadIdx;
uint3e blockIdx;
dim3 blockDim;
size_t emul_smem;
long emul_launches;

/* the dynamic shared memory of the kernels (extern __shared__), refilled with NaN bytes
 * before every block so that a read of what the block never wrote shows */
#define SMEM_MAX 232448
double ssd_sh[SMEM_MAX / 8];
double gdn_sh[SMEM_MAX / 8];
float4 gdn_ps[SMEM_MAX / 16];
float sh[SMEM_MAX / 4];

static pthread_barrier_t g_block;
static pthread_barrier_t g_warp[32];
static unsigned char g_slot[32][32][16];
static thread_local int t_lin;

void __syncthreads(void)
{
    pthread_barrier_wait(&g_block);
}

void emul_warp_put(const void *v, size_t n)
{
    memcpy(g_slot[t_lin / 32][t_lin % 32], v, n);
    pthread_barrier_wait(&g_warp[t_lin / 32]);
}

void emul_warp_get(int lane, void *v, size_t n)
{
    if (lane >= 0)
        memcpy(v, g_slot[t_lin / 32][lane], n);
    else
        pthread_barrier_wait(&g_warp[t_lin / 32]);
}

struct targ {
    void (*body)(void *);
    void *arg;
    int lin;
};

static void *thread_main(void *p)
{
    struct targ *a = (struct targ *)p;
    t_lin = a->lin;
    threadIdx.x = (unsigned)a->lin % blockDim.x;
    threadIdx.y = (unsigned)a->lin / blockDim.x % blockDim.y;
    threadIdx.z = (unsigned)a->lin / (blockDim.x * blockDim.y);
    a->body(a->arg);
    return NULL;
}

void emul_run(void (*body)(void *), void *arg, dim3 grid, dim3 block, size_t smem)
{
    int n = (int)(block.x * block.y * block.z);
    if (n % 32 || n > 1024) {
        fprintf(stderr, "emul: a block of %d threads\n", n);
        exit(1);
    }
    emul_launches++;
    blockDim = block;
    emul_smem = smem;
    pthread_t th[1024];
    struct targ ta[1024];
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 * 1024);
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx = {x, y, z};
                memset(ssd_sh, 0xff, sizeof ssd_sh);
                memset(gdn_sh, 0xff, sizeof gdn_sh);
                memset(gdn_ps, 0xff, sizeof gdn_ps);
                memset(sh, 0xff, sizeof sh);
                pthread_barrier_init(&g_block, NULL, (unsigned)n);
                for (int w = 0; w < n / 32; w++)
                    pthread_barrier_init(&g_warp[w], NULL, 32);
                for (int i = 0; i < n; i++) {
                    ta[i] = {body, arg, i};
                    if (pthread_create(&th[i], &at, thread_main, &ta[i]) != 0) {
                        fprintf(stderr, "emul: pthread_create\n");
                        exit(1);
                    }
                }
                for (int i = 0; i < n; i++)
                    pthread_join(th[i], NULL);
                pthread_barrier_destroy(&g_block);
                for (int w = 0; w < n / 32; w++)
                    pthread_barrier_destroy(&g_warp[w]);
            }
    pthread_attr_destroy(&at);
}
