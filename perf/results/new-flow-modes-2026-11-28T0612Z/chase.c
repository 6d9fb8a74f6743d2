// Pointer chase latency per guest-physical GiB group of 4K pages.
// Build: gcc -O2 -o chase chase.c. Run: REPS=N ONE=1 taskset -c CPU ./chase GIB (GIB of 4 KiB pages; the
// first group of pages by guest-physical GiB with at least 20,000 pages; prints "ms_now ns_per_access"
// per round of 4 x up to 40,000 dependent loads, one line on each of 40,000 distinct pages).
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(int argc,char**argv){
  size_t gib = argc>1?atol(argv[1]):4; size_t bytes=gib<<30; size_t np=bytes/4096;
  char*m=mmap(0,bytes,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  madvise(m,bytes,MADV_NOHUGEPAGE);
  for(size_t i=0;i<np;i++) m[i*4096]=1;
  int fd=open("/proc/self/pagemap",O_RDONLY); uint64_t*pm=malloc(np*8);
  pread(fd,pm,np*8,((uintptr_t)m/4096)*8);
  // group pages by PFN GiB
  int ng=64; size_t*cnt=calloc(ng,sizeof(size_t)); size_t**idx=malloc(ng*sizeof(size_t*));
  for(int g=0;g<ng;g++) idx[g]=malloc(np*sizeof(size_t));
  for(size_t i=0;i<np;i++){uint64_t pfn=pm[i]&((1ULL<<55)-1); int g=(pfn*4096)>>30; if(g<ng) idx[g][cnt[g]++]=i;}
  srand(1);
  for(int g=0;g<ng;g++){ size_t n=cnt[g]; if(n<20000) continue; if(n>40000)n=40000;
    // shuffle and build a chase: one line per page (random line offset)
    for(size_t i=n-1;i>0;i--){size_t j=rand()%(i+1); size_t t=idx[g][i]; idx[g][i]=idx[g][j]; idx[g][j]=t;}
    for(size_t i=0;i<n;i++){ char*a=m+idx[g][i]*4096+((i*7)%64)*64; char*b=m+idx[g][(i+1)%n]*4096+(((i+1)*7)%64)*64; *(char**)a=b; }
    char*p=m+idx[g][0]*4096; for(size_t i=0;i<n;i++) p=*(char**)p;
    for(int r=0;r<(getenv("REPS")?atoi(getenv("REPS")):1);r++){
    double t0=now(); size_t steps=n*4; for(size_t i=0;i<steps;i++) p=*(char**)p; double t=now()-t0;
    printf("%.0f %.0f\n", now()/1e6, t/steps); fflush(stdout);}
    printf(" <- GiB %d%s\n", g, p?"":"!"); if(getenv("ONE")) break;
  }
  return 0;
}
