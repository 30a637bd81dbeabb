# gnuplot -e "dat='OUT/route.dat'; png='docs/img/route-curve.png'" scripts/route_plot.gp
# (dat: `myriad route eval --curve OUT/route.dat`; index 0 the router, 1 random
# routing, 2 kNN, 3 the oracle; columns: remote share, mean judged quality)
set terminal pngcairo size 640,440 font "sans,10" noenhanced
set output png
set xlabel "share of prompts answered remotely (cloud or collaborative)"
set ylabel "mean judged quality (held-out)"
set xrange [0:1]
set key bottom right
set grid
set title "Edge/cloud routing: quality vs cloud share"
plot dat index 0 using 1:2 with lines lw 2 title "router (MLP on edge features)", \
     dat index 1 using 1:2 with lines dt 2 lw 2 lc rgb "gray40" title "random", \
     dat index 2 using 1:2 with lines lw 2 title "kNN on the edge embedding", \
     dat index 3 using 1:2 with lines dt 3 lw 2 lc rgb "black" title "oracle"
